package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestConnectUseSkillNeedsSampling (issue 26 item 7): `capgate connect`
// lists use_skill only to a client that declared sampling, and relays the
// skill's sampling to that client, whose model's answer ends the run. A
// client without sampling does not see use_skill, nor does a 2026-07-28
// client, which connect cannot ask in input rounds yet.
func TestConnectUseSkillNeedsSampling(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve and connect")
	}
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "skills", "greeter", "SKILL.md"), "---\ndescription: Greets\nmax_iterations: 2\n---\nGreet the user.\n")
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.directive.greeter"]

[skills]
dirs = [%q]
`, filepath.Join(root, "skills"))}))
	tok := testkit.Mint(t, s.secret, token.Claims{Sub: "alice", ChatType: "private"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	open := func(opts ...client.ClientOption) *client.Client {
		t.Helper()
		c := newMCPClient(transport.NewStdio(s.bin, append(os.Environ(), "CAPGATE_TOKEN="+tok), "connect", "http://"+s.addr+"/mcp"), opts...)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	names := func(c *client.Client) []string {
		t.Helper()
		l, err := c.ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range l.Tools {
			out = append(out, tl.Name)
		}
		return out
	}

	legacy := client.WithProtocolVersion("2025-11-25")
	if got := names(open(legacy)); slices.Contains(got, "use_skill") {
		t.Errorf("a client without sampling is offered use_skill: %v", got)
	}

	var sampled atomic.Int32
	sampler := samplerFunc(func(_ context.Context, r mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
		sampled.Add(1)
		return &mcp.CreateMessageResult{Model: "scripted", StopReason: "endTurn", SamplingMessage: mcp.SamplingMessage{
			Role: mcp.RoleAssistant, Content: mcp.NewTextContent("hello from the client's model")}}, nil
	})
	if got := names(open(client.WithSamplingHandler(sampler))); slices.Contains(got, "use_skill") {
		t.Errorf("a 2026-07-28 client is offered use_skill, which connect cannot relay to it: %v", got)
	}
	c := open(legacy, client.WithSamplingHandler(sampler))
	if got := names(c); !slices.Contains(got, "use_skill") {
		t.Fatalf("a client with sampling is not offered use_skill: %v", got)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = "use_skill"
	req.Params.Arguments = map[string]any{"skill": "greeter", "message": "greet me"}
	res, err := c.CallTool(ctx, req)
	if err != nil || res.IsError {
		t.Fatalf("use_skill through connect: %v %+v", err, res)
	}
	text := ""
	for _, ct := range res.Content {
		if tc, ok := ct.(mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if !strings.Contains(text, "hello from the client's model") || sampled.Load() != 1 {
		t.Errorf("use_skill through connect = %q after %d sampling requests, want the model's answer after one", text, sampled.Load())
	}
}
