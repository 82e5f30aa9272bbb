package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
	"github.com/capgate/capgate/internal/testkit/oauthas"
)

// TestUpstreamTokenExchange: capgate serve with [auth.oidc] at a real
// oidc-provider and an upstream with auth = "token-exchange". alice and
// bob call it with their own access tokens from that issuer (audience:
// capgate); capgate exchanges each caller's token at the issuer (RFC
// 8693) for one for the upstream's resource, and the upstream sees each
// call as its caller's account. The caller's own token never reaches the
// upstream, and no token is in serve's log, the audit or a response.
func TestUpstreamTokenExchange(t *testing.T) {
	as := oauthas.Start(t)
	wiki := authmcp.Start(t, as.Issuer)
	const audience = "http://capgate.test/mcp"
	s := testkit.StartCapgate(t, testkit.Capgate{Env: []string{"WIKI_EXCHANGE_SECRET=exchange-secret-not-for-prod"},
		Config: fmt.Sprintf(`[auth.oidc]
issuer = %q
audience = %q
[audit]
path = "audit.jsonl"
[policy]
grants = ["rye.execute.tool.mcp.wiki.*"]
[mcp.servers.wiki]
url = %q
auth = "token-exchange"
client_id = "capgate-exchange"
client_secret_env = "WIKI_EXCHANGE_SECRET"
[mcp.servers.wiki.tools.whoami]
risk = "LOW"
`, as.Issuer, audience, wiki.URL)})
	o := &oauthServe{Served: s, as: as, up: wiki}

	own := map[string]string{}
	for _, user := range []string{"alice", "bob"} {
		own[user] = as.UserToken(t, user, audience)
	}
	call := func(user, note string) (who, code, text string) {
		sid := testkit.OpenSession(t, o.URL, own[user], "{}")
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wiki__whoami","arguments":{"note":%q}}}`, note)
		status, _, raw := testkit.PostSession(t, o.URL, own[user], sid, body)
		o.keep(raw)
		if status != 200 {
			t.Fatalf("/mcp as %s: %d %s", user, status, raw)
		}
		raw = sseData(raw)
		text = string(raw)
		if strings.Contains(text, `"isError":true`) {
			return "", "error", text
		}
		if i := strings.Index(text, `"sub":"`); i >= 0 {
			who = text[i+7:]
			who = who[:strings.IndexByte(who, '"')]
		}
		return who, "", text
	}
	// The tools are listed with capgate's own client-credentials token.
	testkit.WaitFor(t, 30*time.Second, "wiki__whoami served", func() bool {
		who, _, _ := call("alice", "a0")
		return who == "alice"
	})
	for i := range 3 {
		for _, user := range []string{"alice", "bob"} {
			if who, _, text := call(user, fmt.Sprintf("%s-%d", user, i)); who != user {
				t.Errorf("%s's call answered as %q: %s", user, who, text)
			}
		}
	}
	if mixed := wiki.Mixed(); len(mixed) > 0 {
		t.Errorf("upstream sessions with two users' tokens: %v", mixed)
	}
	sent := wiki.Tokens()
	for user, tok := range own {
		for _, got := range sent {
			if got == tok {
				t.Errorf("%s's own token was passed through to the upstream", user)
			}
		}
	}
	audit, _ := os.ReadFile(filepath.Join(o.Dir, "audit.jsonl"))
	seen := map[string]string{"serve's log": o.Logs(), "the audit log": string(audit), "the responses": strings.Join(o.out, "\n")}
	for where, text := range seen {
		for _, secret := range append(sent, own["alice"], own["bob"]) {
			if strings.Contains(text, secret) {
				t.Errorf("%s carries a token (%.12s...)", where, secret)
			}
		}
	}
	if len(sent) < 2 {
		t.Errorf("the upstream got %d tokens", len(sent))
	}
}
