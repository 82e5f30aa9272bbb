package main

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
	"github.com/capgate/capgate/internal/testkit/oauthas"
)

// userPerHost is a cookie jar that adds a test_user cookie naming who the
// browser signs in as at each authorization server (oauthas's login page
// answers for it). A plain jar would share one such cookie between two
// servers on two ports of 127.0.0.1, since cookies do not tell ports apart.
type userPerHost struct {
	http.CookieJar
	users map[string]string // host:port → account
}

func (j userPerHost) Cookies(u *url.URL) []*http.Cookie {
	cs := j.CookieJar.Cookies(u)
	if user, ok := j.users[u.Host]; ok {
		cs = append(cs, &http.Cookie{Name: "test_user", Value: user})
	}
	return cs
}

// TestUpstreamOAuthLinkSignIn: with a browser sign-in configured
// ([auth.oidc] client_id, capgate's own OpenID provider, a real
// oidc-provider apart from the tracker's), a link opened in a browser
// first signs that browser in to capgate, and goes on only for the
// subject the link is for. Through a real capgate serve and HTTP browsers
// with cookie jars:
//   - mallory's link forwarded to alice: alice's browser signs in as
//     alice and gets a page saying the link is mallory's; there is no
//     button, and mallory's capgate user is not linked to alice's account
//     (before the fix, alice pressed the button and mallory got her
//     account);
//   - the sign-in's answer, and the pass back to the link it gives, each
//     opened in another browser, are refused;
//   - mallory's own browser signs in as mallory, is sent back to the link
//     page, presses it and links her own account.
//
// The sign-in client's secret is in no log line or page.
func TestUpstreamOAuthLinkSignIn(t *testing.T) {
	t.Parallel()
	upAS := oauthas.Shared(t)
	idp := oauthas.Start(t)
	up := authmcp.Start(t, upAS.Issuer)
	addr := testkit.FreeAddr(t)
	clientID, secret := registerClient(t, idp.Issuer, "http://"+addr+"/oauth/signin")
	o := startOAuthReplica(t, upAS, up, addr, "http://"+addr, `[auth.oidc]
issuer = "`+idp.Issuer+`"
audience = "http://`+addr+`/mcp"
client_id = "`+clientID+`"
client_secret_env = "CAPGATE_SIGNIN_SECRET"
`, []string{"CAPGATE_SIGNIN_SECRET=" + secret})

	idpURL, _ := url.Parse(idp.Issuer)
	upURL, _ := url.Parse(upAS.Issuer)
	browser := func(sub, account string) *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Timeout: 30 * time.Second,
			Jar: userPerHost{jar, map[string]string{idpURL.Host: sub, upURL.Host: account}}}
	}
	linkFor := func(sub string) string {
		link := linkRe.FindString(o.cli(t, "accounts", "link", "tracker", "--sub", sub))
		if link == "" {
			t.Fatalf("no link for %s", sub)
		}
		return link
	}
	linkedTo := func(sub string) string {
		m := regexp.MustCompile(`tracker\s+oauth\s+linked\s+(\S+)`).FindStringSubmatch(o.cli(t, "accounts", "list", "--sub", sub))
		if m == nil {
			return ""
		}
		return m[1]
	}
	var pages []string

	// The forwarded link. alice opens mallory's link and, whatever the
	// page shows, presses its button if it has one.
	link := linkFor("mallory")
	status, page := oauthas.Click(t, browser("alice", "alice-upstream"), link)
	pages = append(pages, page)
	if status != http.StatusForbidden || !strings.Contains(page, "This link is for capgate user <b>mallory</b>, and you signed in as <b>alice</b>. Nothing was linked.") {
		t.Errorf("mallory's link opened in alice's browser: %d\n%s", status, page)
	}
	if strings.Contains(page, `name="csrf"`) {
		t.Errorf("the refusal page has a button:\n%s", page)
	}
	if got := linkedTo("mallory"); got != "" {
		t.Fatalf("a link forwarded to alice linked capgate user mallory to account %q", got)
	}

	// The sign-in's answer, taken from mallory's browser to alice's.
	mallory := browser("mallory", "mallory-upstream")
	stopped := stopAt(mallory, func(u *url.URL) bool { return u.Path == "/oauth/signin" })
	resp, err := stopped.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	answer := resp.Header.Get("Location")
	if resp.StatusCode/100 != 3 || !strings.Contains(answer, "/oauth/signin?") || !strings.Contains(answer, "code=") {
		t.Fatalf("mallory's sign-in did not come back to capgate: %d %q", resp.StatusCode, answer)
	}
	status, page, _ = oauthas.Get(t, browser("alice", "alice-upstream"), answer)
	pages = append(pages, page)
	if status != http.StatusForbidden || !strings.Contains(page, "begun in another browser") || strings.Contains(page, `name="csrf"`) {
		t.Errorf("mallory's sign-in answer in alice's browser: %d\n%s", status, page)
	}

	// The pass back to the link, taken from mallory's browser to alice's:
	// it is bound to mallory's browser, so alice is signed in first, as
	// herself, and refused.
	linkPath := strings.TrimPrefix(link, o.URL)
	stopped = stopAt(mallory, func(u *url.URL) bool { return u.Path == linkPath && u.Query().Has("signin") })
	resp, err = stopped.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	pass := resp.Header.Get("Location")
	if resp.StatusCode/100 != 3 || !strings.Contains(pass, "?signin=") {
		t.Fatalf("mallory's sign-in did not send her back to the link: %d %q", resp.StatusCode, pass)
	}
	passURL, _ := url.Parse(link)
	passURL, _ = passURL.Parse(pass)
	status, page = oauthas.Click(t, browser("alice", "alice-upstream"), passURL.String())
	pages = append(pages, page)
	if status != http.StatusForbidden || !strings.Contains(page, "you signed in as <b>alice</b>") || strings.Contains(page, `name="csrf"`) {
		t.Errorf("mallory's pass back to the link, in alice's browser: %d\n%s", status, page)
	}
	if got := linkedTo("mallory"); got != "" {
		t.Fatalf("mallory's pass in alice's browser linked mallory to account %q", got)
	}

	// mallory's own browser: signed in as mallory, back to the link's
	// page, the button, her own account.
	status, page = oauthas.Click(t, mallory, link)
	pages = append(pages, page)
	if status != http.StatusOK || !strings.Contains(page, "capgate user <b>mallory</b> is now linked to account <b>mallory-upstream</b>") {
		t.Errorf("mallory's own link: %d\n%s", status, page)
	}
	if got := linkedTo("mallory"); got != "mallory-upstream" {
		t.Errorf("mallory is linked to %q, want mallory-upstream", got)
	}

	for where, text := range map[string]string{"serve's log": o.Logs(), "the pages": strings.Join(pages, "\n"), "the CLI": strings.Join(o.out, "\n")} {
		if strings.Contains(text, secret) {
			t.Errorf("%s carries the sign-in client's secret", where)
		}
	}
}
