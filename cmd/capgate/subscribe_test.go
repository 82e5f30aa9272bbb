package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestResourceSubscriptionsUpstream: a caller's resources/subscribe
// reaches the upstream as that upstream's protocol says (issue 31): a
// 2026-07-28 upstream (the conformance fixture over HTTP) finds the URI in
// the filter of capgate's subscriptions/listen stream, a 2025-11-25 one
// (the same fixture over stdio) gets resources/subscribe. The upstream's
// notifications/resources/updated reaches the subscribed caller and no
// other; the last unsubscribe, or the end of the subscriber's session,
// takes the URI out of the upstream's subscriptions again.
func TestResourceSubscriptionsUpstream(t *testing.T) {
	t.Parallel()
	const uri = "test://watched-resource"
	for _, upstream := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(upstream, func(t *testing.T) {
			var server string
			if upstream == "2026-07-28" {
				server = fmt.Sprintf("url = %q", conformance.StartFixture(t))
			} else {
				server = fmt.Sprintf("command = %q", testkit.Build(t, conformance.Fixture))
			}
			cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.cf.*"]
acknowledge = ["elevated"]

[mcp.servers.cf]
%s
`, server)})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			alice, aliceGot := subscriber(ctx, t, cg, "alice")
			bob, bobGot := subscriber(ctx, t, cg, "bob")

			// watched is what the upstream says is subscribed there now,
			// the way this upstream's protocol says ("" when nothing is),
			// and whether anything is subscribed the other way.
			how, other := "listened", "subscribed"
			if upstream == "2025-11-25" {
				how, other = other, how
			}
			watched := func() string {
				res, _ := callText(ctx, t, bob, "cf__watched_resources", nil)
				m, _ := res.StructuredContent.(map[string]any)
				if uris, _ := m[other].([]any); len(uris) > 0 {
					t.Fatalf("the upstream has %v subscribed by %s, on %s", uris, other, upstream)
				}
				uris, _ := m[how].([]any)
				return strings.Trim(fmt.Sprint(uris), "[]")
			}
			update := func() string {
				_, text := callText(ctx, t, bob, "cf__update_resource", map[string]any{"uri": uri})
				return text
			}
			sub := mcp.SubscribeRequest{}
			sub.Params.URI = uri
			if err := alice.Subscribe(ctx, sub); err != nil {
				t.Fatalf("alice's resources/subscribe: %v", err)
			}
			testkit.WaitFor(t, 30*time.Second, "the upstream to have "+uri+" subscribed", func() bool {
				return watched() == uri
			})
			if got := update(); got != "told 1" {
				t.Errorf("the upstream's update reached %q, want capgate's one subscription", got)
			}
			testkit.WaitFor(t, 30*time.Second, "alice's notifications/resources/updated", func() bool {
				return slices.Equal(aliceGot(), []string{uri})
			})

			unsub := mcp.UnsubscribeRequest{}
			unsub.Params.URI = uri
			if err := alice.Unsubscribe(ctx, unsub); err != nil {
				t.Fatalf("alice's resources/unsubscribe: %v", err)
			}
			testkit.WaitFor(t, 30*time.Second, "the upstream to have nothing subscribed", func() bool {
				return watched() == ""
			})
			if got := update(); got != "told 0" {
				t.Errorf("after the last unsubscribe the upstream's update reached %q", got)
			}

			// A subscriber's session that ends takes its subscription along.
			if err := alice.Subscribe(ctx, sub); err != nil {
				t.Fatalf("alice's second resources/subscribe: %v", err)
			}
			testkit.WaitFor(t, 30*time.Second, "the upstream to have "+uri+" subscribed again", func() bool {
				return watched() == uri
			})
			// (mcp-go's client sends its DELETE without the token: capgate
			// refuses it, so the test sends its own.)
			if st := testkit.DeleteSession(t, cg.URL, cg.Token(t, token.Claims{Sub: "alice"}), alice.GetSessionId()); st != 200 {
				t.Fatalf("alice's DELETE: %d", st)
			}
			testkit.WaitFor(t, 30*time.Second, "the upstream to drop the subscription of an ended session", func() bool {
				return watched() == ""
			})
			if got := bobGot(); len(got) != 0 {
				t.Errorf("bob, who subscribed to nothing, got updates of %v", got)
			}
		})
	}
}

// subscriber connects sub to cg at 2025-11-25 and returns the client and
// the URIs of the resources/updated notifications it has got so far.
func subscriber(ctx context.Context, t *testing.T, cg *testkit.Served, sub string) (*client.Client, func() []string) {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(cg.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{
		"Authorization": "Bearer " + cg.Token(t, token.Claims{Sub: sub})}), transport.WithContinuousListening())
	if err != nil {
		t.Fatal(err)
	}
	c := newMCPClient(tr)
	var mu sync.Mutex
	var got []string
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationResourceUpdated) {
			mu.Lock()
			got = append(got, fmt.Sprint(n.Params.AdditionalFields["uri"]))
			mu.Unlock()
		}
	})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("%s: initialize: %v", sub, err)
	}
	return c, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
