package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/tool"
)

type subjectKey struct{}

// seen is what the upstream recorded of one request: its method, its
// Authorization and its session.
type seen struct{ method, auth, session string }

// recordingUpstream serves an mcp-go MCP server over streamable HTTP on
// 127.0.0.1 and records each POST's method, Authorization and session.
func recordingUpstream(t *testing.T) (url string, log func() []seen) {
	t.Helper()
	s := mcpserver.NewMCPServer("rec", "1", mcpserver.WithToolCapabilities(false))
	s.AddTool(mcpgo.NewTool("hello"), func(context.Context, mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		return mcpgo.NewToolResultText("hi"), nil
	})
	h := mcpserver.NewStreamableHTTPServer(s)
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var m struct {
				Method string `json:"method"`
			}
			json.Unmarshal(b, &m)
			mu.Lock()
			got = append(got, seen{m.Method, r.Header.Get("Authorization"), r.Header.Get("Mcp-Session-Id")})
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// TestHooksHeadersAndSessionPerCaller: each caller's requests carry the
// headers its hook gave and go on a session of their own, never another
// caller's; a hook that fails stops the request before it is sent.
func TestHooksHeadersAndSessionPerCaller(t *testing.T) {
	url, log := recordingUpstream(t)
	sub := func(ctx context.Context) string { s, _ := ctx.Value(subjectKey{}).(string); return s }
	s := connect(t, Options{Name: "rec", URL: url, Protocol: Protocol, Timeout: 10 * time.Second, Hooks: Hooks{
		Headers: func(ctx context.Context, ask AskFunc) (http.Header, error) {
			switch who := sub(ctx); who {
			case "mallory":
				return nil, errors.New("no credential for mallory")
			case "":
				return nil, nil
			default:
				return http.Header{"Authorization": {"Bearer token-of-" + who}}, nil
			}
		},
		SessionKey: sub,
	}})
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hello := find(t, ds, "hello")
	for _, who := range []string{"alice", "bob", "alice"} {
		ctx := context.WithValue(context.Background(), subjectKey{}, who)
		res, err := s.Call(ctx, tool.Call{Tool: hello, Input: json.RawMessage(`{}`)})
		if err != nil || len(res.Content) != 1 {
			t.Fatalf("%s: %v %v", who, res, err)
		}
	}
	before := len(log())
	ctx := context.WithValue(context.Background(), subjectKey{}, "mallory")
	if _, err := s.Call(ctx, tool.Call{Tool: hello, Input: json.RawMessage(`{}`)}); err == nil ||
		!strings.Contains(err.Error(), "no credential for mallory") {
		t.Fatalf("a failing hook: %v, want its error", err)
	}
	if n := len(log()); n != before {
		t.Errorf("a failing hook still sent %d requests", n-before)
	}

	sessions := map[string]string{} // session -> the only Authorization it saw
	calls := map[string]int{}
	for _, r := range log() {
		if r.session == "" {
			continue
		}
		if prev, ok := sessions[r.session]; ok && prev != r.auth {
			t.Errorf("session %s carried %q and %q: two callers shared it", r.session, prev, r.auth)
		}
		sessions[r.session] = r.auth
		if r.method == "tools/call" {
			calls[r.auth]++
		}
	}
	if calls["Bearer token-of-alice"] != 2 || calls["Bearer token-of-bob"] != 1 || calls[""] != 0 {
		t.Errorf("tools/call by Authorization: %v, want alice 2, bob 1, none without", calls)
	}
	owners := map[string]bool{}
	for _, auth := range sessions {
		owners[auth] = true
	}
	if !owners[""] || !owners["Bearer token-of-alice"] || !owners["Bearer token-of-bob"] || len(sessions) != 3 {
		t.Errorf("sessions: %v, want the shared one, alice's and bob's", sessions)
	}
}

// TestKeyedSessionRelaysStandaloneStream: a sampling request an upstream
// sends on its standalone stream during a call reaches that call's client
// when the caller has a session of its own, and is refused on the shared
// session, where nothing says whose it is.
func TestKeyedSessionRelaysStandaloneStream(t *testing.T) {
	up := mcpserver.NewMCPServer("asker", "1", mcpserver.WithToolCapabilities(false))
	up.EnableSampling()
	up.AddTool(mcpgo.NewTool("ask"), func(ctx context.Context, _ mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		req := mcpgo.CreateMessageRequest{}
		req.Messages = []mcpgo.SamplingMessage{{Role: mcpgo.RoleUser, Content: mcpgo.NewTextContent("2+2?")}}
		req.MaxTokens = 5
		res, err := up.RequestSampling(ctx, req)
		if err != nil {
			return mcpgo.NewToolResultError("refused: " + err.Error()), nil
		}
		text, _ := res.Content.(mcpgo.TextContent)
		return mcpgo.NewToolResultText("model said " + text.Text), nil
	})
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(up))
	t.Cleanup(srv.Close)
	sub := func(ctx context.Context) string { s, _ := ctx.Value(subjectKey{}).(string); return s }
	s := connect(t, Options{Name: "asker", URL: srv.URL + "/mcp", Protocol: Protocol, Timeout: 10 * time.Second, Hooks: Hooks{SessionKey: sub}})
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	askTool := find(t, ds, "ask")
	var asked []string
	call := tool.Call{Tool: askTool, Input: json.RawMessage(`{}`),
		Ask: func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
			asked = append(asked, method)
			return json.RawMessage(`{"role":"assistant","content":{"type":"text","text":"4"},"model":"m"}`), nil
		}}
	text := func(res *tool.Result) string {
		var b struct{ Text string }
		json.Unmarshal(res.Content[0], &b)
		return b.Text
	}
	res, err := s.Call(context.WithValue(context.Background(), subjectKey{}, "alice"), call)
	if err != nil || text(res) != "model said 4" || len(asked) != 1 {
		t.Fatalf("alice's own session: %v %v, asked %v; want the model's answer relayed", res, err, asked)
	}
	res, err = s.Call(context.Background(), call)
	if err != nil || !strings.HasPrefix(text(res), "refused:") || len(asked) != 1 {
		t.Fatalf("the shared session: %v %v, asked %v; want the request refused", res, err, asked)
	}
}
