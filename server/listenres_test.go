package server

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// TestListenResources runs two 2026-07-28 listens for one resource in
// process (for -race: the relay's subscriptions and each stream's pending
// updates) through mcp-go's client: each gets the upstream's update, the
// upstream keeps the URI while either listens and drops it when both
// have stopped. cmd/capgate's TestListenResourceSubscriptions covers who
// may hear what.
func TestListenResources(t *testing.T) {
	const uri = "test://watched-resource"
	_, url := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{
			Options: srcmcp.Options{Name: "cf", URL: conformance.StartFixture(t)}, Prefix: "cf",
			Tools: map[string]registry.Override{"update_resource": {Level: risk.Low}, "watched_resources": {Level: risk.Low}},
		}}},
		grants: []string{"rye.fetch.*", "rye.execute.tool.mcp.cf.*"},
	})
	tok := mint(t, token.Claims{Sub: "alice"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	caller := connect(t, url, tok, "2025-11-25")
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := caller.CallTool(ctx, req)
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
		return res
	}
	listened := func() string {
		m, _ := call("cf__watched_resources", nil).StructuredContent.(map[string]any)
		uris, _ := m["listened"].([]any)
		return strings.Trim(fmt.Sprint(uris), "[]")
	}

	var got, acked [2]atomic.Int32
	var stops [2]func()
	for i := range 2 {
		c := connect(t, url, tok, "")
		c.OnNotification(func(n mcp.JSONRPCNotification) {
			switch n.Method {
			case mcp.MethodNotificationSubscriptionsAcknowledged:
				acked[i].Add(1)
			case string(mcp.MethodNotificationResourceUpdated):
				if n.Params.AdditionalFields["uri"] == uri {
					got[i].Add(1)
				}
			}
		})
		stop, err := c.ListenAsync(ctx, mcp.SubscriptionFilter{ResourceSubscriptions: []string{uri}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		stops[i] = stop
		defer stop()
	}
	// ListenAsync returns before its request is sent: an update fired
	// before capgate acknowledged a listen would not be that listen's.
	testkit.WaitFor(t, 30*time.Second, "capgate to acknowledge both listens", func() bool {
		return acked[0].Load() == 1 && acked[1].Load() == 1
	})
	testkit.WaitFor(t, 30*time.Second, "the upstream to have "+uri+" in capgate's listen", func() bool {
		return listened() == uri
	})
	call("cf__update_resource", map[string]any{"uri": uri})
	testkit.WaitFor(t, 30*time.Second, "both listens' resources/updated", func() bool {
		return got[0].Load() == 1 && got[1].Load() == 1
	})
	stops[0]()
	call("cf__update_resource", map[string]any{"uri": uri})
	testkit.WaitFor(t, 30*time.Second, "the second listen's next update", func() bool {
		return got[1].Load() == 2
	})
	if listened() != uri {
		t.Errorf("the upstream dropped %s while a listen still has it", uri)
	}
	stops[1]()
	testkit.WaitFor(t, 30*time.Second, "the upstream to drop "+uri+" once both listens stopped", func() bool {
		return listened() == ""
	})
	if n := got[0].Load(); n != 1 {
		t.Errorf("the stopped listen got %d updates", n)
	}
}
