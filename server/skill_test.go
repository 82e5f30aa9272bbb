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
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/internal/testkit"
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

func skillServer(t *testing.T) string {
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
	src := fmt.Sprintf(`
[server]
data_dir = "data"
socket = "-"

[policy]
grants = ["rye.execute.tool.mcp.fx.*", "rye.execute.directive.echoer", "rye.execute.directive.looper",
  "rye.execute.directive.secret", "rye.execute.directive.needs-key"]

[mcp.servers.fx]
command = %q
[mcp.servers.fx.tools.echo]
risk = "LOW"
[mcp.servers.fx.tools.t_00]
risk = "LOW"
`, testkit.Build(t, testkit.MCPFixture))
	path := filepath.Join(dir, "capgate.toml")
	os.WriteFile(path, []byte(src), 0o600)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, cfg)
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
	url := skillServer(t)
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
	url := skillServer(t)
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
