package router

import (
	"slices"
	"testing"

	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// TestBridgeTokenCarriesTheNarrowing: the per-call token a provider gets
// carries the caller's effective caps and ack, a skill's scope included,
// verifies only under the provider's own key and audience, and is refused
// by the router's own front door.
func TestBridgeTokenCarriesTheNarrowing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Policy{Grants: everyone.Grants, Acknowledge: []string{"elevated", "write"}})
	alice := e.caller(t, "alice", "private", func(c *token.Claims) {
		c.Caps = []string{"rye.fetch.*", "rye.execute.tool.bridge.gog.email.*", "rye.execute.tool.mcp.*"}
		c.Ack = []string{"write", "unrestricted"}
	})
	key, err := token.BridgeKey(e.secret, "gog")
	if err != nil {
		t.Fatal(err)
	}
	provider, err := token.NewVerifier(token.Options{Secret: key, Audience: token.BridgeAudience("gog")})
	if err != nil {
		t.Fatal(err)
	}
	scope := &Scope{Name: "mail", Grants: permissions.MustSet("rye.execute.tool.bridge.gog.email.list_messages", "rye.execute.tool.bridge.gog.calendar.*"),
		Acknowledge: []string{"elevated"}}
	for _, tt := range []struct {
		name     string
		c        *Caller
		caps     []string
		ack      []string
		provider string
	}{
		// The token's caps cut the policy's gog.* to email; its ack keeps write.
		{"token", alice, []string{"rye.execute.tool.bridge.gog.email.list_messages", "rye.execute.tool.bridge.gog.email.send"}, []string{"write"}, "gog"},
		// The skill cuts further, to what both allow; no ack is in both.
		{"skill", e.r.within(alice, scope), []string{"rye.execute.tool.bridge.gog.email.list_messages"}, []string{}, "gog"},
	} {
		raw, err := e.r.bridgeToken(tt.c, tt.provider)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := provider.Verify(raw)
		if err != nil {
			t.Fatalf("%s: the provider cannot verify its token: %v", tt.name, err)
		}
		if cl.Sub != "alice" || !slices.Equal(cl.Caps, tt.caps) || !slices.Equal(cl.Ack, tt.ack) || cl.ChatType != "private" {
			t.Errorf("%s: claims sub %q caps %q ack %q chat %q; want caps %q ack %q", tt.name, cl.Sub, cl.Caps, cl.Ack, cl.ChatType, tt.caps, tt.ack)
		}
		if _, err := e.r.Authenticate(raw); tool.ErrorCode(err) != tool.CodeTokenInvalid {
			t.Errorf("%s: the front door took a per-call bridge token: %v", tt.name, err)
		}
	}
	// Another provider's key does not verify it.
	other, _ := token.BridgeKey(e.secret, "other")
	ov, _ := token.NewVerifier(token.Options{Secret: other, Audience: token.BridgeAudience("gog")})
	raw, _ := e.r.bridgeToken(alice, "gog")
	if _, err := ov.Verify(raw); token.ReasonOf(err) != token.ReasonSignature {
		t.Errorf("another provider's key verified gog's token: %v", err)
	}
}
