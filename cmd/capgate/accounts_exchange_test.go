package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
	"github.com/capgate/capgate/internal/testkit/oauthas"
)

// TestUpstreamTokenExchange: capgate serve with [auth.oidc] at a real
// oidc-provider and an upstream with auth = "token-exchange". alice and
// bob call it with their own access tokens from that issuer (audience:
// capgate), over /mcp and over /rpc (the token as context_token and as a
// bearer header), interleaved and at once; capgate exchanges each
// caller's token at the issuer (RFC 8693) for one for the upstream's
// resource, and the upstream sees each call as its caller's account. The
// caller's own token never reaches the upstream, and no token is in
// serve's log, the audit or a response.
func TestUpstreamTokenExchange(t *testing.T) {
	t.Parallel()
	as := oauthas.Shared(t)
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
	for _, user := range []string{"alice", "bob", "carol"} {
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
	// /rpc: the caller's token in params (Ash's context_token) or as a
	// bearer header; capability ids, not exposed names.
	rpc := func(user, note string, header bool) (who, text string) {
		params := fmt.Sprintf(`"capability":"mcp:wiki:whoami","input":{"note":%q}`, note)
		if !header {
			params = fmt.Sprintf(`"context_token":%q,`, own[user]) + params
		}
		req, _ := http.NewRequest(http.MethodPost, o.URL+"/rpc",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{`+params+`}}`))
		req.Header.Set("Content-Type", "application/json")
		if header {
			req.Header.Set("Authorization", "Bearer "+own[user])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return "", ""
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		o.keep(raw)
		var out struct {
			Result struct {
				Output struct{ Sub, Note string }
			}
		}
		if json.Unmarshal(raw, &out) != nil || out.Result.Output.Note != note {
			return "", string(raw)
		}
		return out.Result.Output.Sub, string(raw)
	}
	// Exchanged tokens are cached per subject, whichever door the call came
	// in: bob's and carol's first calls come over /rpc (a token in params,
	// a bearer header), so /rpc's own exchange is what answers them.
	if who, text := rpc("bob", "bob-rpc-first", false); who != "bob" {
		t.Errorf("bob's first call, over /rpc with context_token, answered as %q: %s", who, text)
	}
	if who, text := rpc("carol", "carol-rpc-first", true); who != "carol" {
		t.Errorf("carol's first call, over /rpc with a bearer header, answered as %q: %s", who, text)
	}
	// Each user over both doors, interleaved, then all at once.
	for i := range 3 {
		for _, user := range []string{"alice", "bob", "carol"} {
			if who, text := rpc(user, fmt.Sprintf("%s-rpc-%d", user, i), i%2 == 1); who != user {
				t.Errorf("%s's /rpc call answered as %q: %s", user, who, text)
			}
			if who, _, text := call(user, fmt.Sprintf("%s-mcp-%d", user, i)); who != user {
				t.Errorf("%s's /mcp call answered as %q: %s", user, who, text)
			}
		}
	}
	var wg sync.WaitGroup
	for i := range 4 {
		for _, user := range []string{"alice", "bob", "carol"} {
			wg.Go(func() {
				if who, text := rpc(user, fmt.Sprintf("%s-rpc-at-once-%d", user, i), i%2 == 0); who != user {
					t.Errorf("%s's /rpc call at once answered as %q: %s", user, who, text)
				}
			})
			wg.Go(func() {
				if who, _, text := call(user, fmt.Sprintf("%s-mcp-at-once-%d", user, i)); who != user {
					t.Errorf("%s's /mcp call at once answered as %q: %s", user, who, text)
				}
			})
		}
	}
	wg.Wait()
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
		for _, secret := range append(sent, own["alice"], own["bob"], own["carol"]) {
			if strings.Contains(text, secret) {
				t.Errorf("%s carries a token (%.12s...)", where, secret)
			}
		}
	}
	if len(sent) < 3 {
		t.Errorf("the upstream got %d tokens", len(sent))
	}
}
