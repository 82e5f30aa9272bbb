package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// openConformance starts a Server over the conformance fixture at url
// as upstream cf (no prefix) with grants.
func openConformance(t testing.TB, url string, grants ...string) string {
	t.Helper()
	_, front := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{Options: srcmcp.Options{Name: "cf", URL: url}}}},
		grants:   grants,
	})
	return front
}

// scripted answers sampling and elicitation as a client's user would.
type scripted struct {
	mu       sync.Mutex
	sampled  []mcp.CreateMessageRequest
	elicited []mcp.ElicitationRequest
}

func (s *scripted) CreateMessage(_ context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	s.mu.Lock()
	s.sampled = append(s.sampled, req)
	s.mu.Unlock()
	return &mcp.CreateMessageResult{SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant,
		Content: mcp.NewTextContent("scripted answer")}, Model: "scripted", StopReason: "endTurn"}, nil
}

func (s *scripted) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	s.mu.Lock()
	s.elicited = append(s.elicited, req)
	s.mu.Unlock()
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
		Content: map[string]any{"username": "alice", "email": "alice@example.com"}}}, nil
}

// TestRelayUpstream drives the conformance fixture through capgate with
// both protocols: the upstream's sampling and elicitation requests reach
// the calling client and its answers go back, log messages pass, and
// resources, templates, prompts and completions are served and gated.
func TestRelayUpstream(t *testing.T) {
	fx := conformance.StartFixture(t)
	url := openConformance(t, fx, "rye.execute.tool.mcp.cf.*", "rye.fetch.knowledge.mcp.cf.*", "rye.fetch.directive.mcp.cf.*")
	full := mint(t, token.Claims{Sub: "alice"})
	// narrow may call tools but sees only the static text resource and
	// the simple prompt.
	narrow := mint(t, token.Claims{Sub: "bob", Caps: []string{"rye.execute.tool.mcp.cf.*",
		"rye.fetch.knowledge.mcp.cf.test...static-text", "rye.fetch.directive.mcp.cf.test_simple_prompt"}})

	for _, protocol := range []string{"2025-11-25", ""} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			script := &scripted{}
			c := connect(t, url, full, protocol, client.WithSamplingHandler(script), client.WithElicitationHandler(script))

			call := func(name string, args map[string]any) string {
				t.Helper()
				req := mcp.CallToolRequest{}
				req.Params.Name, req.Params.Arguments = name, args
				res, err := c.CallTool(ctx, req)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return resultText(res)
			}
			// capgate speaks 2026-07-28 to the fixture, whose sampling is then
			// an input round of the call: it reaches this call's client (as a
			// request on the call's stream, or an input round of its own) and
			// the answer goes back.
			if got := call("test_sampling", map[string]any{"prompt": "what is 2+2?"}); !strings.Contains(got, "scripted answer") {
				t.Errorf("test_sampling through capgate = %q, want the client's answer", got)
			}
			if len(script.sampled) != 1 {
				t.Errorf("the client saw sampling requests %+v, want one", script.sampled)
			}
			if got := call("test_elicitation", map[string]any{"message": "who are you?"}); !strings.Contains(got, `"username":"alice"`) {
				t.Errorf("test_elicitation through capgate = %q", got)
			}
			if len(script.elicited) != 1 || script.elicited[0].Params.Message != "who are you?" {
				t.Errorf("the client saw elicitation requests %+v", script.elicited)
			}

			// Resources and templates.
			rl, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
			if err != nil || len(rl.Resources) < 3 {
				t.Fatalf("resources/list = %+v, %v", rl, err)
			}
			rr := mcp.ReadResourceRequest{}
			rr.Params.URI = "test://static-text"
			read, err := c.ReadResource(ctx, rr)
			if err != nil || len(read.Contents) != 1 {
				t.Fatalf("resources/read = %+v, %v", read, err)
			}
			if tc, ok := read.Contents[0].(mcp.TextResourceContents); !ok || tc.Text == "" {
				t.Errorf("resources/read content = %#v", read.Contents[0])
			}
			rr.Params.URI = "test://template/42/data"
			if read, err := c.ReadResource(ctx, rr); err != nil || !strings.Contains(fmt.Sprint(read.Contents), "42") {
				t.Errorf("templated read = %+v, %v", read, err)
			}

			// Prompts and completion.
			pl, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
			if err != nil || len(pl.Prompts) < 4 {
				t.Fatalf("prompts/list = %+v, %v", pl, err)
			}
			gp := mcp.GetPromptRequest{}
			gp.Params.Name = "test_prompt_with_arguments"
			gp.Params.Arguments = map[string]string{"arg1": "A1", "arg2": "B2"}
			prompt, err := c.GetPrompt(ctx, gp)
			if err != nil || !strings.Contains(fmt.Sprint(prompt.Messages), "A1") {
				t.Errorf("prompts/get = %+v, %v", prompt, err)
			}
			cr := mcp.CompleteRequest{}
			cr.Params.Ref = mcp.PromptReference{Type: "ref/prompt", Name: "test_prompt_with_arguments"}
			cr.Params.Argument.Name, cr.Params.Argument.Value = "arg1", "p"
			comp, err := c.Complete(ctx, cr)
			if err != nil || len(comp.Completion.Values) == 0 {
				t.Errorf("completion/complete = %+v, %v", comp, err)
			}

			// A narrower caller sees and reads only what it was granted.
			other := &scripted{}
			nc := connect(t, url, narrow, protocol, client.WithSamplingHandler(other), client.WithElicitationHandler(other))
			rl, err = nc.ListResources(ctx, mcp.ListResourcesRequest{})
			if err != nil || len(rl.Resources) != 1 || rl.Resources[0].URI != "test://static-text" {
				t.Errorf("narrow resources/list = %+v, %v", rl, err)
			}
			rr.Params.URI = "test://static-binary"
			if _, err := nc.ReadResource(ctx, rr); err == nil {
				t.Error("narrow read of a resource it may not fetch succeeded")
			}
			pl, err = nc.ListPrompts(ctx, mcp.ListPromptsRequest{})
			if err != nil || len(pl.Prompts) != 1 || pl.Prompts[0].Name != "test_simple_prompt" {
				t.Errorf("narrow prompts/list = %+v, %v", pl, err)
			}
			gp.Params.Name = "test_prompt_with_arguments"
			if _, err := nc.GetPrompt(ctx, gp); err == nil {
				t.Error("narrow prompts/get of a prompt it may not fetch succeeded")
			}
		})
	}
}

// TestRelayLogging passes the upstream's log messages of a call to the
// client that made it.
func TestRelayLogging(t *testing.T) {
	fx := conformance.StartFixture(t)
	url := openConformance(t, fx, "rye.execute.tool.mcp.cf.*")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	script := &scripted{}
	c := connect(t, url, mint(t, token.Claims{Sub: "alice"}), "2025-11-25", client.WithSamplingHandler(script), client.WithElicitationHandler(script))
	var mu sync.Mutex
	var logs []string
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == "notifications/message" {
			b, _ := json.Marshal(n.Params.AdditionalFields["data"])
			mu.Lock()
			logs = append(logs, string(b))
			mu.Unlock()
		}
	})
	lv := mcp.SetLevelRequest{}
	lv.Params.Level = mcp.LoggingLevelDebug
	if err := c.SetLevel(ctx, lv); err != nil {
		t.Fatal(err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = "test_tool_with_logging"
	if _, err := c.CallTool(ctx, req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// mcp-go's server puts each log message on the call's stream or on its
	// standalone one, whichever reads first; the latter names no call and
	// is dropped (issue 14). What comes is the call's, in order.
	want := []string{`"Tool execution started"`, `"Tool processing data"`, `"Tool execution completed"`}
	rest := want
	for _, l := range logs {
		i := slices.Index(rest, l)
		if i < 0 {
			t.Errorf("log messages = %v, want some of %v, in order", logs, want)
			break
		}
		rest = rest[i+1:]
	}
}
