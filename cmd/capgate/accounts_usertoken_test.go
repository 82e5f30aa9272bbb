package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
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

// TestUpstreamUserToken: a real capgate serve with auth = "user-token" in
// front of a real MCP server that takes only its authorization server's
// tokens and says whose each is. alice gets her link from the CLI, bob
// from /rpc's auth_url; each enters their own personal token on the form
// the link opens (a form posted without the page's cookie is refused),
// and their calls, interleaved and at once, carry their own token only.
// The tokens entered are in no response, log line or audit record, nor
// in the clear in capgate.db.
func TestUpstreamUserToken(t *testing.T) {
	t.Parallel()
	as := oauthas.Shared(t)
	wiki := authmcp.Start(t, as.Issuer)
	addr := testkit.FreeAddr(t)
	s := testkit.StartCapgate(t, testkit.Capgate{Addr: addr, Server: fmt.Sprintf("public_url = %q", "http://"+addr),
		Config: authServerConfig("wiki", wiki.URL, "user-token")})
	o := &oauthServe{Served: s, as: as, up: wiki}
	// Each user's personal token: an access token of the wiki's own
	// authorization server, for the wiki, as the user would copy it from
	// the wiki's settings.
	personal := map[string]string{"alice": as.UserToken(t, "alice-wiki", wiki.URL), "bob": as.UserToken(t, "bob-wiki", wiki.URL)}

	enter := func(user, link string) {
		t.Helper()
		jar, _ := cookiejar.New(nil)
		browser := &http.Client{Jar: jar, Timeout: 30 * time.Second}
		status, form, at := oauthas.Get(t, browser, link)
		o.keep([]byte(form))
		m := csrfField.FindStringSubmatch(form)
		if status != http.StatusOK || m == nil || !strings.Contains(form, "<b>"+user+"</b>: enter your own token for <b>wiki</b>") {
			t.Fatalf("%s's link: %d\n%s", user, status, form)
		}
		// The same form posted from another site (no cookie of the page).
		resp, err := http.PostForm(at, url.Values{"csrf": {m[1]}, "token": {"forged-token-0123456789"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s's form posted without the page's cookie: %d, want 403", user, resp.StatusCode)
		}
		resp, err = browser.PostForm(at, url.Values{"csrf": {m[1]}, "token": {personal[user]}})
		if err != nil {
			t.Fatal(err)
		}
		status, page, _ := readPage(t, resp)
		o.keep([]byte(page))
		if status != http.StatusOK || !strings.Contains(page, "<h1>Saved</h1>") {
			t.Fatalf("%s's token entered: %d\n%s", user, status, page)
		}
	}

	enter("alice", linkRe.FindString(o.cli(t, "accounts", "link", "wiki", "--sub", "alice")))
	testkit.WaitFor(t, 30*time.Second, "wiki's tools listed with alice's token", func() bool {
		who, _, _ := o.invokeCap(t, "alice", "mcp:wiki:whoami", "poll")
		return who == "alice-wiki"
	})
	_, code, authURL := o.invokeCap(t, "bob", "mcp:wiki:whoami", "b0")
	if code != "capability_auth_required" || !linkRe.MatchString(authURL) {
		t.Fatalf("bob without a token over /rpc: %q %q", code, authURL)
	}
	enter("bob", authURL)

	var wg sync.WaitGroup
	for i := range 6 {
		for _, user := range []string{"alice", "bob"} {
			wg.Go(func() {
				if who, code, _ := o.invokeCap(t, user, "mcp:wiki:whoami", fmt.Sprintf("%s-%d", user, i)); who != user+"-wiki" {
					t.Errorf("%s's call %d answered as %q (%s)", user, i, who, code)
				}
			})
		}
	}
	wg.Wait()
	if mixed := wiki.Mixed(); len(mixed) > 0 {
		t.Errorf("upstream sessions with two users' tokens: %v", mixed)
	}
	for _, got := range wiki.Tokens() {
		if got != personal["alice"] && got != personal["bob"] {
			t.Errorf("the wiki was sent a token no user entered (%.12s...)", got)
		}
	}

	var audit []byte
	testkit.WaitFor(t, 15*time.Second, "the calls in the audit log", func() bool {
		audit, _ = os.ReadFile(filepath.Join(o.Dir, "audit.jsonl"))
		return strings.Count(string(audit), `"sub":"bob"`) >= 6
	})
	db, _ := os.ReadFile(filepath.Join(o.Dir, "data", "capgate.db"))
	wal, _ := os.ReadFile(filepath.Join(o.Dir, "data", "capgate.db-wal"))
	seen := map[string]string{"serve's log": o.Logs(), "the audit log": string(audit), "the responses": strings.Join(o.out, "\n"),
		"capgate.db": string(db) + string(wal)}
	for where, text := range seen {
		for user, tok := range personal {
			if strings.Contains(text, tok) {
				t.Errorf("%s carries %s's token", where, user)
			}
		}
	}
	if len(audit) == 0 || len(db) == 0 {
		t.Fatalf("nothing to check: audit %d bytes, capgate.db %d bytes", len(audit), len(db))
	}
}

// readPage reads resp, the page a browser landed on.
func readPage(t *testing.T, resp *http.Response) (int, string, string) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Request.URL.String()
}
