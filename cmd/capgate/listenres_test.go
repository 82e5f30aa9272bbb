package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/token"
)

// resourceListen is one 2026-07-28 subscriptions/listen stream as a
// client reads it: what its acknowledgement agreed to, and the URIs of
// the notifications/resources/updated that follow.
type resourceListen struct {
	agreed  []string
	updates chan string
	stop    context.CancelFunc
}

// listenResources opens a subscriptions/listen at base as tok whose
// filter is filter (the members of params.notifications), and reads its
// acknowledgement. Every resources/updated must name the listen.
func listenResources(t *testing.T, base, tok, filter string) *resourceListen {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":"R1","method":"subscriptions/listen","params":{"notifications":{%s},%s}}`, filter, metaPlain)
	events := openListen(ctx, t, base, tok, body)
	type message struct {
		Method string `json:"method"`
		Params struct {
			Meta          map[string]any `json:"_meta"`
			URI           string         `json:"uri"`
			Notifications struct {
				Resources []string `json:"resourceSubscriptions"`
			} `json:"notifications"`
		} `json:"params"`
	}
	var ack message
	first := <-events
	if json.Unmarshal([]byte(first), &ack) != nil || ack.Method != "notifications/subscriptions/acknowledged" {
		t.Fatalf("subscriptions/listen: want the acknowledgement first, got %q", first)
	}
	l := &resourceListen{agreed: ack.Params.Notifications.Resources, updates: make(chan string, 64), stop: stop}
	go func() {
		defer close(l.updates)
		for ev := range events {
			var m message
			if json.Unmarshal([]byte(ev), &m) != nil || m.Method != "notifications/resources/updated" {
				continue
			}
			if m.Params.Meta["io.modelcontextprotocol/subscriptionId"] != "R1" {
				t.Errorf("a resources/updated that does not name its listen: %s", ev)
			}
			l.updates <- m.Params.URI
		}
	}()
	return l
}

// next is the URI of l's next update, failing after a generous deadline.
func (l *resourceListen) next(t *testing.T, who string) string {
	t.Helper()
	select {
	case uri, ok := <-l.updates:
		if !ok {
			t.Fatalf("%s's listen ended before an update", who)
		}
		return uri
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no resources/updated within 30s", who)
	}
	return ""
}

// TestListenResourceSubscriptions: a 2026-07-28 caller's
// subscriptions/listen with resourceSubscriptions (issue 31), through a
// real capgate serve in front of the conformance fixture over HTTP.
// Alice asks for the watched resource and an unknown URI: she is agreed
// the first alone. Carol may read only test://static-text: she asks for
// both, and for tool list changes (mcp-go serves that part), and is
// agreed static-text alone, like an unknown URI. Bob asks for static-text
// only. The upstream sees the URIs in the filter of capgate's own listen
// at it. An update of the watched resource, then one of static-text:
// alice gets the first; bob and carol get the second as their first (the
// upstream sends both on one stream in order, so the first would have
// come before). When alice's stream ends the upstream no longer has the
// watched resource, but still static-text, until bob's and carol's end.
func TestListenResourceSubscriptions(t *testing.T) {
	t.Parallel()
	const watched, static = "test://watched-resource", "test://static-text"
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.cf.*"]
acknowledge = ["elevated"]

[mcp.servers.cf]
url = %q
`, conformance.StartFixture(t))})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dave, _ := subscriber(ctx, t, cg, "dave") // calls the fixture's tools
	listened := func() string {
		res, _ := callText(ctx, t, dave, "cf__watched_resources", nil)
		m, _ := res.StructuredContent.(map[string]any)
		uris, _ := m["listened"].([]any)
		return strings.Trim(fmt.Sprint(uris), "[]")
	}
	update := func(uri string) string {
		_, text := callText(ctx, t, dave, "cf__update_resource", map[string]any{"uri": uri})
		return text
	}

	alice := listenResources(t, cg.URL, cg.Token(t, token.Claims{Sub: "alice"}),
		fmt.Sprintf(`"resourceSubscriptions":[%q,"test://no-such-resource"]`, watched))
	if fmt.Sprint(alice.agreed) != "["+watched+"]" {
		t.Fatalf("alice was agreed %v, want only %s", alice.agreed, watched)
	}
	carolTok := cg.Token(t, token.Claims{Sub: "carol", Caps: []string{"rye.execute.tool.mcp.cf.*",
		permissions.Required(permissions.Fetch, permissions.Knowledge, "mcp:cf:"+static)}})
	carol := listenResources(t, cg.URL, carolTok,
		fmt.Sprintf(`"toolsListChanged":true,"resourceSubscriptions":[%q,%q]`, watched, static))
	if fmt.Sprint(carol.agreed) != "["+static+"]" {
		t.Fatalf("carol, who may not read %s, was agreed %v, want only %s", watched, carol.agreed, static)
	}
	bob := listenResources(t, cg.URL, cg.Token(t, token.Claims{Sub: "bob"}), fmt.Sprintf(`"resourceSubscriptions":[%q]`, static))
	if fmt.Sprint(bob.agreed) != "["+static+"]" {
		t.Fatalf("bob was agreed %v, want %s", bob.agreed, static)
	}
	both := static + " " + watched
	testkit.WaitFor(t, 30*time.Second, "the upstream to have both resources in capgate's listen", func() bool {
		return listened() == both
	})

	if got := update(watched); got != "told 1" {
		t.Errorf("the upstream's update of %s reached %q, want capgate's one listen", watched, got)
	}
	if got := update(static); got != "told 1" {
		t.Errorf("the upstream's update of %s reached %q, want capgate's one listen", static, got)
	}
	if got := alice.next(t, "alice"); got != watched {
		t.Errorf("alice's first update is of %s, want %s", got, watched)
	}
	if got := bob.next(t, "bob"); got != static {
		t.Errorf("bob, who did not subscribe to %s, got its update", got)
	}
	if got := carol.next(t, "carol"); got != static {
		t.Errorf("carol, who may not read %s, got its update", got)
	}

	alice.stop()
	testkit.WaitFor(t, 30*time.Second, "the upstream to drop "+watched+" when alice's stream ends", func() bool {
		return listened() == static
	})
	bob.stop()
	if got := update(static); got != "told 1" {
		t.Errorf("with carol still listening the upstream's update reached %q", got)
	}
	if got := carol.next(t, "carol"); got != static {
		t.Errorf("carol's second update is of %s", got)
	}
	carol.stop()
	testkit.WaitFor(t, 30*time.Second, "the upstream to have nothing subscribed once every stream ended", func() bool {
		return listened() == ""
	})
}
