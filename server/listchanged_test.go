package server

import (
	"context"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// TestListChangedRelayed: a stateless (2026-07-28) upstream whose tool
// list changes announces it on its subscriptions/listen stream; capgate
// lists it again and tells its own callers, a 2026-07-28 client on its
// listen stream and a 2025-11-25 session on its standalone stream, and
// both then list the tool as it is now.
func TestListChangedRelayed(t *testing.T) {
	addr := testkit.FreeAddr(t)
	testkit.ServeMCPFixture(t, "-http", addr)
	_, url := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{
			Options: srcmcp.Options{Name: "fx", URL: "http://" + addr + "/mcp"}, Prefix: "fx",
			Tools: map[string]registry.Override{"mutate": {Level: risk.Low}, "echo": {Level: risk.Low}},
		}}},
		grants: []string{"rye.fetch.tool.mcp.fx.*", "rye.execute.tool.mcp.fx.mutate"},
	})
	tok := mint(t, token.Claims{Sub: "alice"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	heard := map[string]chan struct{}{}
	clients := map[string]interface {
		ListTools(context.Context, mcp.ListToolsRequest) (*mcp.ListToolsResult, error)
	}{}
	for _, protocol := range []string{"", "2025-11-25"} {
		// A handler has the 2025-11-25 client keep its standalone stream open.
		c := connect(t, url, tok, protocol, client.WithSamplingHandler(&scripted{}))
		ch := make(chan struct{}, 16)
		c.OnNotification(func(n mcp.JSONRPCNotification) {
			if n.Method == string(mcp.MethodNotificationToolsListChanged) {
				ch <- struct{}{}
			}
		})
		if protocol == "" {
			stop, err := c.ListenAsync(ctx, mcp.SubscriptionFilter{ToolsListChanged: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
		}
		heard[protocol], clients[protocol] = ch, c
	}
	caller := connect(t, url, tok, "")
	// capgate's stream to the upstream opens in the background: mutate
	// until a change is heard.
	for protocol, ch := range heard {
		testkit.WaitFor(t, 30*time.Second, "tools/list_changed at protocol "+protocol, func() bool {
			req := mcp.CallToolRequest{}
			req.Params.Name = "fx__mutate"
			if res, err := caller.CallTool(ctx, req); err != nil || res.IsError {
				t.Fatalf("mutate: %v %+v", err, res)
			}
			select {
			case <-ch:
				return true
			case <-time.After(time.Second):
				return false
			}
		})
		tools, err := clients[protocol].ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var desc string
		for _, tl := range tools.Tools {
			if tl.Name == "fx__echo" {
				desc = tl.Description
			}
		}
		if desc != "Echo a message, and keep a copy" {
			t.Errorf("protocol %q: fx__echo's description after the change: %q", protocol, desc)
		}
	}
}
