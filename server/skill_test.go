package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/token"
)

// model is a scripted client model: each sampling request gets the next
// reply; it records what it was offered.
type model struct {
	mu      sync.Mutex
	replies []func(req mcp.CreateMessageRequest) *mcp.CreateMessageResult
	seen    []mcp.CreateMessageRequest
}

func (m *model) CreateMessage(_ context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = append(m.seen, req)
	i := min(len(m.seen), len(m.replies)) - 1
	return m.replies[i](req), nil
}

func toolUse(name, input string) func(mcp.CreateMessageRequest) *mcp.CreateMessageResult {
	return func(req mcp.CreateMessageRequest) *mcp.CreateMessageResult {
		return &mcp.CreateMessageResult{Model: "scripted", StopReason: "toolUse", SamplingMessage: mcp.SamplingMessage{
			Role: mcp.RoleAssistant, Content: mcp.ToolUseContent{Type: "tool_use", ID: fmt.Sprintf("use-%d", len(req.Messages)),
				Name: name, Input: json.RawMessage(input)}}}
	}
}

// answer replies with text that quotes the last tool result it was given.
func answer(prefix string) func(mcp.CreateMessageRequest) *mcp.CreateMessageResult {
	return func(req mcp.CreateMessageRequest) *mcp.CreateMessageResult {
		b, _ := json.Marshal(req.Messages[len(req.Messages)-1].Content)
		return &mcp.CreateMessageResult{Model: "scripted", StopReason: "endTurn", SamplingMessage: mcp.SamplingMessage{
			Role: mcp.RoleAssistant, Content: mcp.NewTextContent(prefix + string(b))}}
	}
}

func skillServer(t *testing.T) (*testServer, string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(dir, "skills", name, "SKILL.md")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(text), 0o600)
	}
	write("echoer", "---\ndescription: Echo things back\nallowed_tools: [fx__echo]\nmax_iterations: 3\nmodel: small\n---\nEcho what you are asked to echo, with the echo tool.\n")
	write("looper", "---\ndescription: Never finishes\nallowed_tools: [fx__echo]\nmax_iterations: 2\n---\nKeep echoing.\n")
	write("secret", "---\ndescription: Private only\nsensitive: true\n---\nDo private things.\n")
	write("needs-key", "---\ndescription: Needs an API key\nenv: [API_KEY]\n---\nUse the key.\n")
	write("mailer", "---\ndescription: Reads mail\ncapabilities: [gog.email]\n---\nRead the mail.\n")
	write("team", "---\ndescription: Team things\nsensitive: true\naccess: {chat_types: [group]}\n---\nDo team things.\n")
	write("helper", "---\ndescription: Declares no tools\n---\nHelp with whatever tools the caller has.\n")
	fx := fixtureServer(t)
	fx.Tools = map[string]registry.Override{"echo": {Level: risk.Low}, "t_00": {Level: risk.Low}}
	return serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{fx}},
		grants: []string{"rye.execute.tool.mcp.fx.*", "rye.execute.directive.echoer", "rye.execute.directive.looper",
			"rye.execute.directive.secret", "rye.execute.directive.needs-key", "rye.execute.directive.mailer",
			"rye.execute.tool.bridge.gog.email.*", "rye.execute.directive.team", "rye.execute.directive.helper"},
		workspace: dir,
	})
}

func useSkill(t *testing.T, c *client.Client, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = UseSkill, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("use_skill %v: %v", args, err)
	}
	return res
}

// TestUseSkill runs skills through real MCP sessions (both protocols)
// whose client's model is a script: the model is offered only the
// skill's allowed tools, a tool the skill did not declare is refused even
// though the caller may call it, inner calls go through the router, and
// the loop stops at max_iterations with a partial result flagged.
func TestUseSkill(t *testing.T) {
	_, url := skillServer(t)
	tok := mint(t, token.Claims{Sub: "alice", ChatType: "group"})
	for _, protocol := range []string{"2025-11-25", ""} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{
				toolUse("fx__t_00", `{}`), // not declared by the skill
				toolUse("fx__echo", `{"message":"hello"}`),
				answer("done: "),
			}}
			c := connect(t, url, tok, protocol, client.WithSamplingHandler(m))

			// The caller may call t_00 itself.
			req := mcp.CallToolRequest{}
			req.Params.Name = "fx__t_00"
			if res, err := c.CallTool(context.Background(), req); err != nil || res.IsError {
				t.Fatalf("the caller's own call of fx__t_00: %v %+v", err, res)
			}

			res := useSkill(t, c, map[string]any{"skill": "echoer", "message": "echo hello", "context": "a test"})
			text := resultText(res)
			if res.IsError || !strings.Contains(text, `This is the result from running the "echoer" skill`) ||
				!strings.Contains(text, "echo: hello") {
				t.Fatalf("use_skill echoer = %v %q", res.IsError, text)
			}
			if len(m.seen) != 3 {
				t.Fatalf("the model was asked %d times, want 3", len(m.seen))
			}
			first := m.seen[0]
			var offered []string
			for _, tl := range first.CreateMessageParams.Tools {
				offered = append(offered, tl.Name)
			}
			if !slices.Equal(offered, []string{"fx__echo"}) {
				t.Errorf("the model was offered %v, want only fx__echo", offered)
			}
			if !strings.Contains(first.CreateMessageParams.SystemPrompt, "Echo what you are asked to echo") {
				t.Errorf("system prompt %q lacks the skill's instructions", first.CreateMessageParams.SystemPrompt)
			}
			if first.CreateMessageParams.ModelPreferences == nil || len(first.CreateMessageParams.ModelPreferences.Hints) == 0 || first.CreateMessageParams.ModelPreferences.Hints[0].Name != "small" {
				t.Errorf("model preferences %+v, want the hint small", first.CreateMessageParams.ModelPreferences)
			}
			refusal, _ := json.Marshal(m.seen[1].CreateMessageParams.Messages[len(m.seen[1].CreateMessageParams.Messages)-1])
			if !strings.Contains(string(refusal), "not available to skill echoer") || !strings.Contains(string(refusal), `"isError":true`) {
				t.Errorf("t_00 inside the skill was not refused: %s", refusal)
			}

			// The iteration limit.
			loop := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{toolUse("fx__echo", `{"message":"again"}`)}}
			lc := connect(t, url, tok, protocol, client.WithSamplingHandler(loop))
			res = useSkill(t, lc, map[string]any{"skill": "looper", "message": "go"})
			if !res.IsError || !strings.Contains(resultText(res), "iteration limit") || len(loop.seen) != 2 {
				t.Errorf("looper: isError=%v asked=%d %q", res.IsError, len(loop.seen), resultText(res))
			}
		})
	}
}

// TestUseSkillAccess checks who may run what: the capability intersection
// with the caller's grants, a sensitive skill outside a private chat, a
// skill missing its env value, and a skill the caller may not see.
func TestUseSkillAccess(t *testing.T) {
	_, url := skillServer(t)
	m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{answer("ok")}}

	// The caller's token may run echoer but not call fx.echo: the skill
	// cannot widen it, so echo is not offered.
	narrow := mint(t, token.Claims{Sub: "bob", ChatType: "private",
		Caps: []string{"rye.execute.directive.echoer", "rye.execute.tool.mcp.fx.t_00"}})
	c := connect(t, url, narrow, "", client.WithSamplingHandler(m))
	res := useSkill(t, c, map[string]any{"skill": "echoer", "message": "echo"})
	if res.IsError || len(m.seen) != 1 || len(m.seen[0].CreateMessageParams.Tools) != 0 {
		t.Errorf("narrow caller: isError=%v %q; offered %+v", res.IsError, resultText(res), m.seen)
	}
	// It may not even see looper.
	if res := useSkill(t, c, map[string]any{"skill": "looper", "message": "x"}); !strings.Contains(resultText(res), "capability_not_found") {
		t.Errorf("looper for a caller without its grant = %q", resultText(res))
	}

	group := connect(t, url, mint(t, token.Claims{Sub: "carol", ChatType: "group"}), "", client.WithSamplingHandler(m))
	if res := useSkill(t, group, map[string]any{"skill": "secret", "message": "x"}); !strings.Contains(resultText(res), "capability_access_denied") ||
		!strings.Contains(resultText(res), "private") {
		t.Errorf("sensitive skill in a group chat = %q", resultText(res))
	}
	if res := useSkill(t, group, map[string]any{"skill": "needs-key", "message": "x"}); !strings.Contains(resultText(res), "API_KEY") {
		t.Errorf("skill without its env value = %q", resultText(res))
	}
	if res := useSkill(t, group, map[string]any{"skill": "echoer"}); !strings.Contains(resultText(res), "message") {
		t.Errorf("use_skill without a message = %q", resultText(res))
	}

	// Skills are prompts too.
	prompts, err := group.ListPrompts(context.Background(), mcp.ListPromptsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range prompts.Prompts {
		names = append(names, p.Name)
	}
	if !slices.Contains(names, "echoer") || slices.Contains(names, "needs-key") {
		t.Errorf("prompts = %v, want echoer and not the unusable needs-key", names)
	}
	gp := mcp.GetPromptRequest{}
	gp.Params.Name = "echoer"
	p, err := group.GetPrompt(context.Background(), gp)
	if err != nil || !strings.Contains(fmt.Sprint(p.Messages), "Echo what you are asked") {
		t.Errorf("prompts/get echoer = %+v, %v", p, err)
	}
}

// connectCaps is connect with the client capabilities caps declared (at
// initialize on 2025-11-25, in every request's _meta on 2026-07-28).
func connectCaps(t *testing.T, url, tok, protocol string, caps mcp.ClientCapabilities, handlers ...client.ClientOption) *client.Client {
	t.Helper()
	topts := []transport.StreamableHTTPCOption{transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok})}
	if protocol == "2025-11-25" && len(handlers) > 0 {
		topts = append(topts, transport.WithContinuousListening())
	}
	tr, err := transport.NewStreamableHTTP(url+"/mcp", topts...)
	if err != nil {
		t.Fatal(err)
	}
	opts := append(handlers, client.WithClientCapabilities(caps))
	if protocol != "" {
		opts = append(opts, client.WithProtocolVersion(protocol))
	}
	c := client.NewClient(tr, opts...)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = protocol
	if protocol == "" {
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	}
	init.Params.Capabilities = caps
	if _, err := c.Initialize(context.Background(), init); err != nil {
		t.Fatal(err)
	}
	return c
}

func toolNames(t *testing.T, c *client.Client) []string {
	t.Helper()
	res, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}

func promptDescription(t *testing.T, c *client.Client, name string) string {
	t.Helper()
	res, err := c.ListPrompts(context.Background(), mcp.ListPromptsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Prompts {
		if p.Name == name {
			return p.Description
		}
	}
	t.Fatalf("prompt %s is not listed", name)
	return ""
}

// TestUseSkillNeedsSampling: use_skill runs on the client's model, so a
// client that did not declare sampling (at initialize on 2025-11-25, per
// request on 2026-07-28) is not offered it, its skill prompts say why,
// and a call of it anyway is refused before anything runs.
func TestUseSkillNeedsSampling(t *testing.T) {
	_, url := skillServer(t)
	tok := mint(t, token.Claims{Sub: "alice", ChatType: "private"})
	for _, protocol := range []string{"2025-11-25", ""} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			plain := connect(t, url, tok, protocol)
			if names := toolNames(t, plain); slices.Contains(names, UseSkill) || !slices.Contains(names, "fx__echo") {
				t.Errorf("tools for a client without sampling = %v, want fx__echo and no use_skill", names)
			}
			if d := promptDescription(t, plain, "echoer"); !strings.HasPrefix(d, "Echo things back") ||
				!strings.Contains(d, "use_skill needs a client that supports sampling") {
				t.Errorf("echoer's prompt for a client without sampling: %q, want it to say why use_skill is absent", d)
			}
			// A call anyway is refused as for any tool the client was not offered.
			req := mcp.CallToolRequest{}
			req.Params.Name, req.Params.Arguments = UseSkill, map[string]any{"skill": "echoer", "message": "echo"}
			if res, err := plain.CallTool(context.Background(), req); err == nil || !strings.Contains(err.Error(), "tool 'use_skill' not found") {
				t.Errorf("use_skill from a client without sampling = %+v, %v", res, err)
			}

			m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{answer("ok")}}
			sampler := connect(t, url, tok, protocol, client.WithSamplingHandler(m))
			if names := toolNames(t, sampler); !slices.Contains(names, UseSkill) {
				t.Errorf("tools for a client with sampling = %v, want use_skill", names)
			}
			if d := promptDescription(t, sampler, "echoer"); d != "Echo things back" {
				t.Errorf("echoer's prompt for a client with sampling: %q", d)
			}
		})
	}
}

// TestUseSkillSamplingWithoutTools: a client that declared sampling but
// not sampling.tools is never sent tools or toolChoice (the spec forbids
// it); the skill runs on its model without them.
func TestUseSkillSamplingWithoutTools(t *testing.T) {
	_, url := skillServer(t)
	tok := mint(t, token.Claims{Sub: "alice", ChatType: "private"})
	for _, protocol := range []string{"2025-11-25", ""} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{answer("plain: ")}}
			c := connectCaps(t, url, tok, protocol, mcp.ClientCapabilities{Sampling: &mcp.SamplingCapability{}},
				client.WithSamplingHandler(m))
			res := useSkill(t, c, map[string]any{"skill": "echoer", "message": "echo hello"})
			if res.IsError || !strings.Contains(resultText(res), "plain: ") {
				t.Fatalf("use_skill echoer = %v %q", res.IsError, resultText(res))
			}
			if len(m.seen) != 1 {
				t.Fatalf("the model was asked %d times, want 1", len(m.seen))
			}
			if p := m.seen[0].CreateMessageParams; len(p.Tools) != 0 || p.ToolChoice != nil {
				t.Errorf("a client without sampling.tools was sent tools %v, toolChoice %+v", p.Tools, p.ToolChoice)
			}
		})
	}
}

// TestUseSkillCapabilities: a skill that declares capabilities: [gog.email]
// is refused up front, naming the capability string, to a caller who
// lacks it; its model is never asked. A caller who has it runs it.
func TestUseSkillCapabilities(t *testing.T) {
	_, url := skillServer(t)
	m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{answer("read: ")}}
	lacking := mint(t, token.Claims{Sub: "bob", ChatType: "private", Caps: []string{"rye.execute.directive.mailer", "rye.execute.tool.mcp.fx.*"}})
	c := connect(t, url, lacking, "", client.WithSamplingHandler(m))
	res := useSkill(t, c, map[string]any{"skill": "mailer", "message": "read my mail"})
	text := resultText(res)
	if !res.IsError || !strings.Contains(text, "permission_denied") || !strings.Contains(text, "gog.email") ||
		!strings.Contains(text, "rye.execute.tool.bridge.gog.email.*") {
		t.Errorf("mailer for a caller without gog.email = %v %q", res.IsError, text)
	}
	if len(m.seen) != 0 {
		t.Errorf("the model was asked %d times for a refused run", len(m.seen))
	}

	full := connect(t, url, mint(t, token.Claims{Sub: "carol", ChatType: "private"}), "", client.WithSamplingHandler(m))
	if res := useSkill(t, full, map[string]any{"skill": "mailer", "message": "read my mail"}); res.IsError || len(m.seen) != 1 {
		t.Errorf("mailer for a caller with gog.email = %v %q, model asked %d times", res.IsError, resultText(res), len(m.seen))
	}
}

// TestUseSkillAshAccess runs two Ash skills through real MCP sessions: a
// sensitive skill whose access.chat_types names group runs in a group chat
// and not in a private one (sensitive means private only when
// access.chat_types is unset), and a skill that declares no allowed_tools
// inherits the caller's tools, never more than the caller's own.
func TestUseSkillAshAccess(t *testing.T) {
	_, url := skillServer(t)
	m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{answer("ok")}}
	group := connect(t, url, mint(t, token.Claims{Sub: "carol", ChatType: "group"}), "", client.WithSamplingHandler(m))
	if res := useSkill(t, group, map[string]any{"skill": "team", "message": "x"}); res.IsError {
		t.Errorf("sensitive skill with chat_types [group] in a group chat = %q", resultText(res))
	}
	private := connect(t, url, mint(t, token.Claims{Sub: "carol", ChatType: "private"}), "", client.WithSamplingHandler(m))
	if res := useSkill(t, private, map[string]any{"skill": "team", "message": "x"}); !strings.Contains(resultText(res), "capability_access_denied") ||
		!strings.Contains(resultText(res), "only allowed in group chats") {
		t.Errorf("sensitive skill with chat_types [group] in a private chat = %q", resultText(res))
	}

	offered := func(req mcp.CreateMessageRequest) []string {
		var names []string
		for _, tl := range req.CreateMessageParams.Tools {
			names = append(names, tl.Name)
		}
		return names
	}
	// The full caller: helper's model is offered the caller's tools, and
	// its call of one runs.
	full := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{toolUse("fx__t_00", `{}`), answer("did: ")}}
	c := connect(t, url, mint(t, token.Claims{Sub: "alice", ChatType: "private"}), "", client.WithSamplingHandler(full))
	res := useSkill(t, c, map[string]any{"skill": "helper", "message": "help"})
	if res.IsError || len(full.seen) != 2 {
		t.Fatalf("helper for the full caller = %v %q, model asked %d times", res.IsError, resultText(res), len(full.seen))
	}
	if names := offered(full.seen[0]); !slices.Contains(names, "fx__echo") || !slices.Contains(names, "fx__t_00") {
		t.Errorf("helper offered the full caller %v, want its tools fx__echo and fx__t_00", names)
	}
	if last, _ := json.Marshal(full.seen[1].CreateMessageParams.Messages); strings.Contains(string(last), `"isError":true`) {
		t.Errorf("helper's call of fx__t_00 was refused: %s", last)
	}
	// A narrow caller: only its own tool, and the other is refused.
	narrow := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{toolUse("fx__t_00", `{}`), answer("did: ")}}
	nc := connect(t, url, mint(t, token.Claims{Sub: "bob", ChatType: "private",
		Caps: []string{"rye.execute.directive.helper", "rye.execute.tool.mcp.fx.echo"}}), "", client.WithSamplingHandler(narrow))
	useSkill(t, nc, map[string]any{"skill": "helper", "message": "help"})
	if len(narrow.seen) != 2 {
		t.Fatalf("helper for the narrow caller: model asked %d times", len(narrow.seen))
	}
	if names := offered(narrow.seen[0]); !slices.Equal(names, []string{"fx__echo"}) {
		t.Errorf("helper offered the narrow caller %v, want only fx__echo", names)
	}
	if last, _ := json.Marshal(narrow.seen[1].CreateMessageParams.Messages); !strings.Contains(string(last), `"isError":true`) {
		t.Errorf("helper widened the narrow caller: its call of fx__t_00 ran: %s", last)
	}
}

// TestUseSkillAudit: each run is one skill_run record in the audit file
// with its skill, iterations, tool calls and outcome, refusals included.
func TestUseSkillAudit(t *testing.T) {
	s, url := skillServer(t)
	tok := mint(t, token.Claims{Sub: "alice", ChatType: "private"})
	m := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{
		toolUse("fx__echo", `{"message":"hello"}`),
		answer("done: "),
	}}
	c := connect(t, url, tok, "", client.WithSamplingHandler(m))
	if res := useSkill(t, c, map[string]any{"skill": "echoer", "message": "echo hello"}); res.IsError {
		t.Fatalf("use_skill echoer = %q", resultText(res))
	}
	loop := &model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{toolUse("fx__echo", `{"message":"again"}`)}}
	lc := connect(t, url, tok, "", client.WithSamplingHandler(loop))
	useSkill(t, lc, map[string]any{"skill": "looper", "message": "go"})
	narrow := connect(t, url, mint(t, token.Claims{Sub: "bob", ChatType: "private", Caps: []string{"rye.execute.directive.mailer"}}), "",
		client.WithSamplingHandler(m))
	useSkill(t, narrow, map[string]any{"skill": "mailer", "message": "x"})

	// A client whose model fails on the second request: the client gives
	// up on the call, and the run ends in an error after two iterations.
	failing := &failingModel{model: model{replies: []func(mcp.CreateMessageRequest) *mcp.CreateMessageResult{
		toolUse("fx__echo", `{"message":"once"}`)}}, after: 1}
	fc := connect(t, url, tok, "2025-11-25", client.WithSamplingHandler(failing))
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = UseSkill, map[string]any{"skill": "echoer", "message": "x"}
	if res, err := fc.CallTool(context.Background(), req); err == nil && !res.IsError {
		t.Errorf("use_skill with a failing model = %q", resultText(res))
	}

	// The failed run's record comes once capgate sees the call abandoned.
	var runs []string
	testkit.Poll(10*time.Second, func() bool { runs = skillRuns(t, s); return len(runs) >= 4 })
	want := []string{
		"alice|skill:echoer|echoer|allow|||iterations=2 tool_calls=1 outcome=done",
		"alice|skill:looper|looper|allow|||iterations=2 tool_calls=1 outcome=partial",
		"bob|skill:mailer|mailer|deny|permission_denied|rye.execute.tool.bridge.gog.email.*|iterations=0 tool_calls=0 outcome=refused",
		"alice|skill:echoer|echoer|error|capability_backend_unavailable||iterations=2 tool_calls=1 outcome=error",
	}
	if !slices.Equal(runs, want) {
		t.Errorf("skill_run records:\n%s\nwant:\n%s", strings.Join(runs, "\n"), strings.Join(want, "\n"))
	}
	// The grant checks of a run's inner calls name the skill's layer once.
	layers := grantLayers(t, s)
	if !slices.Contains(layers, "skill echoer+policy") || slices.ContainsFunc(layers, func(l string) bool { return strings.HasPrefix(l, "skill skill") }) {
		t.Errorf("grant_check layers %q, want one of them %q", layers, "skill echoer+policy")
	}
}

// grantLayers are the layers of the grant_check records in s's audit file.
func grantLayers(t *testing.T, s *testServer) []string {
	t.Helper()
	b, err := os.ReadFile(s.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	var layers []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev struct{ Type, Layer string }
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "grant_check" {
			layers = append(layers, ev.Layer)
		}
	}
	return layers
}

// failingModel answers as model does for its first after requests, then
// fails as a client's model can.
type failingModel struct {
	model
	after int
}

func (f *failingModel) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	f.mu.Lock()
	n := len(f.seen)
	f.mu.Unlock()
	if n >= f.after {
		return nil, fmt.Errorf("the model is overloaded")
	}
	return f.model.CreateMessage(ctx, req)
}

// skillRuns are the skill_run records in s's audit file, each as
// sub|tool|tool_name|decision|code|capability|detail.
func skillRuns(t *testing.T, s *testServer) []string {
	t.Helper()
	if err := s.Audit.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	var runs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue // an empty log
		}
		var ev struct {
			Type, Sub, Tool, Decision, Code, Required, Detail string
			ToolName                                          string `json:"tool_name"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if ev.Type == "skill_run" {
			runs = append(runs, strings.Join([]string{ev.Sub, ev.Tool, ev.ToolName, ev.Decision, ev.Code, ev.Required, ev.Detail}, "|"))
		}
	}
	return runs
}

// TestUseSkillHandedOn: a 2026-07-28 run parked here whose state another
// replica used (it rebuilt the run from it, and records it) ends here
// without a record when its park runs out; a run nobody came back for is
// recorded as abandoned, as before.
func TestUseSkillHandedOn(t *testing.T) {
	s, url := skillServer(t)
	tok := mint(t, token.Claims{Sub: "alice", ChatType: "private"})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{"sampling":{"tools":{}}}}`
	begin := func() (*requestState, *job) {
		t.Helper()
		_, _, b := testkit.PostMCP(t, url, tok, UseSkill, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"use_skill",`+
			`"arguments":{"skill":"echoer","message":"echo hello"},`+meta+`}}`)
		var r struct{ Result json.RawMessage }
		json.Unmarshal(b, &r)
		res, err := mcp.ParseCallToolResult(&r.Result)
		if err != nil {
			t.Fatalf("use_skill: %v: %s", err, b)
		}
		_, state, pending := callToolResultInput(res)
		st, err := s.MCP.jobs.seals().open(state, "alice", time.Now())
		if !pending || err != nil {
			t.Fatalf("use_skill = %s (%v)", b, err)
		}
		s.MCP.jobs.mu.Lock()
		j := s.MCP.jobs.parked[st.ID]
		s.MCP.jobs.mu.Unlock()
		if j == nil {
			t.Fatal("the run is not parked")
		}
		return st, j
	}
	waitDone := func(j *job) {
		t.Helper()
		select {
		case <-j.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not end")
		}
	}

	// Another replica used the state: it claimed it in the shared store.
	st, j := begin()
	if err := s.MCP.jobs.seals().use(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	s.MCP.jobs.abandon(j)
	waitDone(j)
	if runs := skillRuns(t, s); len(runs) != 0 {
		t.Errorf("a run handed on was recorded here: %q", runs)
	}

	_, j = begin()
	s.MCP.jobs.abandon(j)
	waitDone(j)
	want := []string{"alice|skill:echoer|echoer|error|capability_backend_unavailable||iterations=1 tool_calls=0 outcome=error"}
	if runs := skillRuns(t, s); !slices.Equal(runs, want) {
		t.Errorf("an abandoned run's records = %q, want %q", runs, want)
	}
}
