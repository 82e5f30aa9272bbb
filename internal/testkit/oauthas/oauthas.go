// Package oauthas runs a real authorization server for tests: panva's
// certified oidc-provider from the npm registry (node/package.json pins it,
// node/package-lock.json pins its dependencies), started with the
// machine's node. See node/server.mjs for what it is configured to do.
//
// Without node or npm a test skips, unless CI is set: then it fails, and
// .ci/run installs both.
package oauthas

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/capgate/capgate/internal/testkit"
)

// AS is a running authorization server.
type AS struct {
	Issuer string
}

// nodeDir is this package's node/ directory.
func nodeDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "node")
}

func missing(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s, and CI must run the authorization-server tests (.ci/run installs node and npm)", why)
	}
	tb.Skip(why)
}

// Install makes sure oidc-provider is installed (npm ci, once per lock
// file per machine) and returns the directory to run server.mjs in.
func Install(tb testing.TB) string {
	tb.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(tb, tool+" not found: the authorization server is oidc-provider on node")
		}
	}
	src := nodeDir()
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		tb.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(src, "server.mjs"))
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(append(lock, script...))
	dir := filepath.Join(os.TempDir(), "capgate-oauthas-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "oidc-provider", "package.json")); err == nil {
		return dir
	}
	// Installed beside, then renamed into place: test binaries running at
	// once never see half an install.
	tmp, err := os.MkdirTemp(os.TempDir(), "capgate-oauthas-install-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"package.json", "package-lock.json", "server.mjs"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		missing(tb, fmt.Sprintf("npm ci of oidc-provider failed (no registry?): %v\n%s", err, out))
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "node_modules")); serr != nil {
			tb.Fatalf("installing oidc-provider: %v", err)
		}
	}
	return dir
}

// Start runs the authorization server on a free loopback port until the
// test ends. env adds to its environment (AS_ACCESS_TTL=seconds sets the
// access tokens' lifetime).
func Start(tb testing.TB, env ...string) *AS {
	tb.Helper()
	a, stop := start(tb, env...)
	tb.Cleanup(stop)
	return a
}

var (
	sharedMu sync.Mutex
	shared   *AS
)

// Shared is one authorization server, with the default settings, for all
// the tests of a package whose TestMain is testkit.Main: it stops when they
// are done. A start costs about a second of CPU, and tests that register
// their own clients and sign in users of their own do not see one
// another's. Without testkit.Main it is Start.
func Shared(tb testing.TB) *AS {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		return shared
	}
	a, stop := start(tb)
	if !testkit.AtExit(stop) {
		tb.Cleanup(stop)
		return a
	}
	shared = a
	return a
}

// start runs the authorization server and returns it and what stops it.
func start(tb testing.TB, env ...string) (*AS, func()) {
	tb.Helper()
	dir := Install(tb)
	addr := testkit.FreeAddr(tb)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("node", "server.mjs", port)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if issuer, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				ready <- issuer
			}
		}
		close(ready)
	}()
	select {
	case issuer, ok := <-ready:
		if !ok {
			stop()
			tb.Fatalf("the authorization server exited: %s", stderr.String())
		}
		return &AS{Issuer: issuer}, stop
	case <-time.After(2 * time.Minute): // node on a loaded machine: a deadline, not a measure
		stop()
		tb.Fatalf("the authorization server did not start: %s", stderr.String())
	}
	return nil, stop
}

// Browser is a user's browser: it signs in to the AS as user (its login
// page answers for the test_user cookie) and follows every redirect.
func (a *AS) Browser(tb testing.TB, user string) *http.Client {
	tb.Helper()
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(a.Issuer)
	jar.SetCookies(u, []*http.Cookie{{Name: "test_user", Value: user, Path: "/"}})
	return &http.Client{Jar: jar, Timeout: 30 * time.Second}
}

// Visit opens link in user's browser, presses the button of the page it
// shows (capgate's: which capgate user is linked to which server), follows
// the AS's sign-in and consent to wherever it ends (capgate's callback
// page), and returns that page's status and text.
func (a *AS) Visit(tb testing.TB, user, link string) (int, string) {
	tb.Helper()
	return Click(tb, a.Browser(tb, user), link)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// Click opens link in browser and, when the page it shows has capgate's
// button (a form with a csrf field and nothing to enter), presses it and
// follows where that leads. It returns the last page's status and text.
func Click(tb testing.TB, browser *http.Client, link string) (int, string) {
	tb.Helper()
	status, page, at := Get(tb, browser, link)
	m := csrfRe.FindStringSubmatch(page)
	if status != http.StatusOK || m == nil || strings.Contains(page, `name="token"`) {
		return status, page
	}
	resp, err := browser.PostForm(at, url.Values{"csrf": {html.UnescapeString(m[1])}})
	if err != nil {
		tb.Fatalf("pressing the link page's button: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Get opens link in browser, following redirects, and returns the last
// page's status, text and address.
func Get(tb testing.TB, browser *http.Client, link string) (int, string, string) {
	tb.Helper()
	resp, err := browser.Get(link)
	if err != nil {
		tb.Fatalf("opening %s: %v", link, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Request.URL.String()
}

// UserToken is an access token the AS issues user for resource, as an
// MCP client of capgate would get one: a public client registered
// dynamically, the authorization code flow with PKCE in user's browser,
// and the resource parameter (RFC 8707). It is a JWT (at+jwt) whose aud is
// resource and whose sub is user.
func (a *AS) UserToken(tb testing.TB, user, resource string) string {
	tb.Helper()
	const redirect = "http://127.0.0.1:9/callback" // never reached: the browser stops before it
	body, _ := json.Marshal(map[string]any{"redirect_uris": []string{redirect}, "grant_types": []string{"authorization_code"},
		"response_types": []string{"code"}, "token_endpoint_auth_method": "none"})
	resp, err := http.Post(a.Issuer+"/reg", "application/json", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	if err != nil || reg.ClientID == "" {
		tb.Fatalf("registering a client: %d %v", resp.StatusCode, err)
	}
	cfg := &oauth2.Config{ClientID: reg.ClientID, RedirectURL: redirect, Scopes: []string{"mcp:tools"},
		Endpoint: oauth2.Endpoint{AuthURL: a.Issuer + "/auth", TokenURL: a.Issuer + "/token", AuthStyle: oauth2.AuthStyleInParams}}
	verifier := oauth2.GenerateVerifier()
	browser := a.Browser(tb, user)
	browser.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), redirect) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	resp, err = browser.Get(cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", resource)))
	if err != nil {
		tb.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		tb.Fatalf("no code from the AS: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	tok, err := cfg.Exchange(context.Background(), loc.Query().Get("code"), oauth2.VerifierOption(verifier),
		oauth2.SetAuthURLParam("resource", resource))
	if err != nil {
		tb.Fatalf("the code exchange: %v", err)
	}
	return tok.AccessToken
}
