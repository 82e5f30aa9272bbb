package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestServeElevatedGrantNeedsAcknowledge: Rye denies an elevated grant
// without <acknowledge> even when its pattern matches. Through a real
// capgate serve and real MCP sessions: a subject granted
// rye.execute.tool.mcp.* (tier elevated) without acknowledging it cannot
// call, and is told which tier to acknowledge; with acknowledge =
// ["elevated"] it can; a token whose ack claim drops elevated cannot.
func TestServeElevatedGrantNeedsAcknowledge(t *testing.T) {
	t.Parallel()
	s := startServe(t, `
[mcp.servers.fy]
command = "`+testkit.Build(t, testkit.MCPFixture)+`"
risk = "LOW"

[policy.subjects.bob]
grants = ["rye.execute.tool.mcp.*"]

[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.*"]
acknowledge = ["elevated"]
`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mint := func(sub string, c token.Claims) string {
		c.Sub, c.ChatType = sub, "private"
		return s.cg.Token(t, c)
	}
	echo := map[string]any{"message": "hi"}

	text, isErr := callTool(ctx, t, s.mcpAs(t, mint("bob", token.Claims{})), "fy__echo", echo)
	if !isErr || !strings.Contains(text, "permission_denied") || !strings.Contains(text, `acknowledge \"elevated\"`) ||
		!strings.Contains(text, "rye.execute.tool.mcp.*") {
		t.Errorf("bob, elevated grant not acknowledged: %.400s; want permission_denied naming the grant and the tier to acknowledge", text)
	}
	text, isErr = callTool(ctx, t, s.mcpAs(t, mint("alice", token.Claims{})), "fy__echo", echo)
	if isErr || !strings.Contains(text, "hi") {
		t.Errorf("alice, elevated acknowledged: %.400s", text)
	}
	// The ack claim narrows: the grant that stood on elevated falls with it.
	text, isErr = callTool(ctx, t, s.mcpAs(t, mint("alice", token.Claims{Ack: []string{"write"}})), "fy__echo", echo)
	if !isErr || !strings.Contains(text, "permission_denied") || !strings.Contains(text, `acknowledge \"elevated\"`) ||
		!strings.Contains(text, "ack claim") {
		t.Errorf("alice, token ack without elevated: %.400s; want permission_denied naming the ack claim", text)
	}
	// Token caps in an unacknowledged tier are dropped likewise; fx is
	// granted by the policy to everyone, the caps alone are elevated.
	text, isErr = callTool(ctx, t, s.mcpAs(t, mint("bob", token.Claims{Caps: []string{"rye.fetch.*", "rye.execute.tool.mcp.*"}})), "fx__echo", echo)
	if !isErr || !strings.Contains(text, "permission_denied") || !strings.Contains(text, `acknowledge \"elevated\"`) {
		t.Errorf("bob, elevated caps not acknowledged: %.400s", text)
	}
}
