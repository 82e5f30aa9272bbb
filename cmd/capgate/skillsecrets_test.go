//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestSkillEnvReachesOnlyItsCalls: a skill's [skills.NAME] env reaches the
// bridge provider and the extension command its run calls, as
// secrets_allowed, even where they guarantee no_env_read; the same tools
// called outside the skill do not see it.
func TestSkillEnvReachesOnlyItsCalls(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	const secret = "skill-only-value-31d9"
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "skills", "keyed", "SKILL.md"), "---\ndescription: Uses a value\nenv: [SKILL_VALUE]\n"+
		"allowed_tools: [gog__calendar_list_events, probe__env]\nmax_iterations: 4\n---\nUse the value.\n")
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	writeFile(t, filepath.Join(root, "packs", "probe", "extension.yaml"), fmt.Sprintf(
		"id: probe\nname: Probe\ndescription: Hostile commands\ncommands:\n  env:\n    description: Read its value\n"+
			"    run: [%q, \"--json\", \"env=SKILL_VALUE\"]\n    risk: LOW\n    capabilities: {env: none}\n", hostile))
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{
		// capgate's own environment has a value too: it must not leak.
		Env: []string{"SKILL_VALUE=capgate-own-value"},
		Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.bridge.gog.*", "rye.execute.tool.ext.probe.*", "rye.execute.directive.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]
env = ["SKILL_VALUE"]

[capabilities.providers.gog]
command = [%q]
env = ["SKILL_VALUE"]
capabilities = { env = "none" }

[skills]
dirs = [%q]

[skills.keyed]
env = { SKILL_VALUE = %q }
`, filepath.Join(root, "packs"), testkit.Build(t, testkit.BridgeFixture), filepath.Join(root, "skills"), secret)}))
	tok := testkit.Mint(t, s.secret, token.Claims{Sub: "alice", ChatType: "private"})

	// Outside the skill: neither tool sees a value.
	out, errb, code := s.as(t, tok, "invoke", "--capability", "gog.calendar", "--operation", "list_events",
		"--input-json", `{"attempt":"env=SKILL_VALUE"}`)
	if code != 0 || strings.Contains(out, secret) || strings.Contains(out, "capgate-own-value") || !strings.Contains(out, "denied") {
		t.Errorf("the bridge outside the skill: %d %s %s", code, out, errb)
	}
	out, errb, code = s.as(t, tok, "invoke", "--capability", "ext:probe:env")
	if code != 0 || strings.Contains(out, secret) || strings.Contains(out, "capgate-own-value") || !strings.Contains(out, "denied") {
		t.Errorf("the extension outside the skill: %d %s %s", code, out, errb)
	}

	// Inside: a scripted model calls both, then answers.
	var mu sync.Mutex
	var results []string
	step := 0
	sampler := samplerFunc(func(_ context.Context, r mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
		mu.Lock()
		defer mu.Unlock()
		if step > 0 {
			b, _ := json.Marshal(r.Messages[len(r.Messages)-1].Content)
			results = append(results, string(b))
		}
		step++
		use := func(name, input string) *mcp.CreateMessageResult {
			return &mcp.CreateMessageResult{Model: "scripted", StopReason: "toolUse", SamplingMessage: mcp.SamplingMessage{
				Role: mcp.RoleAssistant, Content: mcp.ToolUseContent{Type: "tool_use", ID: fmt.Sprint("use-", step), Name: name,
					Input: json.RawMessage(input)}}}
		}
		switch step {
		case 1:
			return use("gog__calendar_list_events", `{"attempt":"env=SKILL_VALUE"}`), nil
		case 2:
			return use("probe__env", `{}`), nil
		}
		return &mcp.CreateMessageResult{Model: "scripted", StopReason: "endTurn", SamplingMessage: mcp.SamplingMessage{
			Role: mcp.RoleAssistant, Content: mcp.NewTextContent("done")}}, nil
	})
	// 2025-11-25, listening: the server's sampling requests arrive on the
	// session's stream.
	tr, err := transport.NewStreamableHTTP("http://"+s.addr+"/mcp", transport.WithContinuousListening(),
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
	if err != nil {
		t.Fatal(err)
	}
	caps := mcp.ClientCapabilities{Sampling: &mcp.SamplingCapability{Tools: &struct{}{}}}
	c := newMCPClient(tr, client.WithSamplingHandler(sampler), client.WithClientCapabilities(caps),
		client.WithProtocolVersion("2025-11-25"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion, init.Params.Capabilities = "2025-11-25", caps
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = "use_skill"
	req.Params.Arguments = map[string]any{"skill": "keyed", "message": "use the value"}
	res, err := c.CallTool(ctx, req)
	if err != nil || res.IsError {
		t.Fatalf("use_skill: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(results) != 2 {
		t.Fatalf("the model saw %d tool results: %v", len(results), results)
	}
	for i, r := range results {
		if !strings.Contains(r, "ok "+secret) {
			t.Errorf("tool %d inside the skill did not see the skill's value: %s", i+1, r)
		}
	}
}
