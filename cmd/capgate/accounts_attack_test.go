package main

import (
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit/oauthas"
)

// stopAt makes browser stop before following a redirect to a request
// that match accepts, and leaves the redirect as its answer.
func stopAt(browser *http.Client, match func(*url.URL) bool) *http.Client {
	c := *browser
	c.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		if match(req.URL) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	return &c
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// press opens link in browser and presses its page's button, returning
// the response to the press as the browser's last answer (or the
// opening's, when that stopped at a redirect: a link that had no page).
func press(t *testing.T, browser *http.Client, link string) *http.Response {
	t.Helper()
	resp, err := browser.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 == 3 {
		return resp
	}
	m := csrfField.FindStringSubmatch(string(b))
	if resp.StatusCode != 200 || m == nil {
		t.Fatalf("the link page: %d %s", resp.StatusCode, b)
	}
	resp, err = browser.PostForm(resp.Request.URL.String(), url.Values{"csrf": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestUpstreamOAuthLinkAttacks performs, through a real capgate serve, a
// real oidc-provider and real HTTP browsers with cookie jars, the attacks
// on account linking:
//   - login CSRF: mallory begins a sign-in, stops before capgate's
//     callback, and has alice's browser open the callback URL (code and
//     state): refused, nothing linked; mallory's own browser can still
//     complete it;
//   - a link forwarded to alice: opening it does not sign her in anywhere
//     by itself (it shows whose capgate account it links, and waits for a
//     press), and a form posted to it from another site (without the
//     page's cookie) is refused: mallory never gets alice's account;
//   - the PKCE verifier at rest: with the operations database in hand
//     (capgate.db), no string in any auth flow hashes to the code
//     challenge the authorization server was sent.
func TestUpstreamOAuthLinkAttacks(t *testing.T) {
	t.Parallel()
	o := startOAuthServe(t)
	linkFor := func(sub string) string {
		link := linkRe.FindString(o.cli(t, "accounts", "link", "tracker", "--sub", sub))
		if link == "" {
			t.Fatalf("no link for %s", sub)
		}
		return link
	}
	issuer, _ := url.Parse(o.as.Issuer)
	linkedTo := func(sub string) string {
		m := regexp.MustCompile(`tracker\s+oauth\s+linked\s+(\S+)`).FindStringSubmatch(o.cli(t, "accounts", "list", "--sub", sub))
		if m == nil {
			return ""
		}
		return m[1]
	}

	// Login CSRF. mallory signs in upstream as herself and keeps the
	// callback URL instead of following it.
	mallory := stopAt(o.as.Browser(t, "mallory-upstream"), func(u *url.URL) bool { return u.Path == "/oauth/callback" })
	resp := press(t, mallory, linkFor("mallory"))
	callback := resp.Header.Get("Location")
	if resp.StatusCode/100 != 3 || !strings.Contains(callback, "/oauth/callback?") || !strings.Contains(callback, "code=") {
		t.Fatalf("mallory's sign-in did not reach the callback: %d %q", resp.StatusCode, callback)
	}
	// alice's browser, which has opened a link of its own (so it holds
	// capgate cookies), is made to open mallory's callback.
	alice := o.as.Browser(t, "alice-upstream")
	if status, _, _ := oauthas.Get(t, alice, linkFor("alice")); status != 200 {
		t.Fatalf("alice's own link: %d", status)
	}
	status, page, _ := oauthas.Get(t, alice, callback)
	if status == http.StatusOK || strings.Contains(page, "is now linked") {
		t.Errorf("mallory's callback in alice's browser: %d\n%s", status, page)
	}
	if got := linkedTo("mallory"); got != "" {
		t.Errorf("mallory's callback completed in alice's browser linked mallory to %q", got)
	}
	// The browser that began it still completes it.
	if status, page, _ := oauthas.Get(t, mallory, callback); status != http.StatusOK || !strings.Contains(page, "<b>mallory</b> is now linked to account <b>mallory-upstream</b>") {
		t.Errorf("mallory's own callback: %d\n%s", status, page)
	}
	if status, _, _ := oauthas.Get(t, mallory, callback); status == http.StatusOK {
		t.Errorf("the callback worked twice")
	}

	// A forwarded link: mallory's new link, opened in alice's browser,
	// which is signed in at the authorization server (consent is given at
	// once there), goes nowhere by itself.
	forwarded := linkFor("mallory")
	status, page, at := oauthas.Get(t, alice, forwarded)
	if status != http.StatusOK || !strings.HasPrefix(at, o.URL+"/oauth/link/") || !strings.Contains(page, "links capgate user <b>mallory</b>") {
		t.Errorf("mallory's link opened by alice: %d at %s\n%s", status, at, page)
	}
	// Another site makes alice's browser post the link's form: the
	// browser sends no SameSite=Lax cookie with a cross-site post, which
	// a client without the page's cookie stands for.
	csrf := ""
	if m := csrfField.FindStringSubmatch(page); m != nil {
		csrf = m[1]
	}
	forged := o.as.Browser(t, "alice-upstream")
	resp, err := forged.PostForm(forwarded, url.Values{"csrf": {csrf}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Errorf("a cross-site post of mallory's link form: %d", resp.StatusCode)
	}
	if got := linkedTo("mallory"); got != "mallory-upstream" {
		t.Errorf("after the forwarded link, mallory is linked to %q, want still mallory-upstream", got)
	}

	// The verifier at rest. bob's sign-in stops at the authorization
	// server's door; its code challenge is in the redirect.
	bob := stopAt(o.as.Browser(t, "bob-upstream"), func(u *url.URL) bool { return u.Host == issuer.Host })
	resp = press(t, bob, linkFor("bob"))
	authz, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || authz.Query().Get("code_challenge_method") != "S256" || authz.Query().Get("code_challenge") == "" {
		t.Fatalf("the redirect to the authorization server: %v %s", err, resp.Header.Get("Location"))
	}
	challenge := authz.Query().Get("code_challenge")
	db, err := sql.Open("sqlite", "file:"+filepath.Join(o.Dir, "data", "capgate.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT state FROM auth_flows`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	candidate := regexp.MustCompile(`[A-Za-z0-9._~-]{43,128}`)
	for rows.Next() {
		var state []byte
		if err := rows.Scan(&state); err != nil {
			t.Fatal(err)
		}
		n++
		for _, m := range candidate.FindAll(state, -1) {
			sum := sha256.Sum256(m)
			if base64.RawURLEncoding.EncodeToString(sum[:]) == challenge {
				t.Errorf("the PKCE verifier of bob's sign-in is in capgate.db in the clear")
			}
		}
	}
	if n == 0 {
		t.Fatal("no auth flow in capgate.db: nothing was checked")
	}
}
