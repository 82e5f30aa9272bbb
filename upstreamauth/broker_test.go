package upstreamauth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/oauth2"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
	"github.com/capgate/capgate/internal/testkit/oauthas"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/upstreamauth"
)

// The package's tests share one authorization server (oauthas.Shared).
func TestMain(m *testing.M) { testkit.Main(m) }

// lockedBuf is a log both replicas write.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type env struct {
	as    *oauthas.AS
	mcp   *authmcp.Server
	store *store.Store
	pub   *httptest.Server
	log   *lockedBuf
	b     *upstreamauth.Broker
}

// newBroker is one replica's broker over the shared store and public URL.
func (e *env) newBroker(t testing.TB, refreshBefore time.Duration) *upstreamauth.Broker {
	t.Helper()
	b, err := upstreamauth.New(upstreamauth.Options{
		PublicURL: e.pub.URL, Store: e.store, RefreshBefore: refreshBefore,
		Logger:  slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Servers: []upstreamauth.Server{{Name: "tracker", URL: e.mcp.URL, Mode: upstreamauth.ModeOAuth}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func setup(t testing.TB) *env {
	t.Helper()
	e := &env{as: oauthas.Shared(t), log: &lockedBuf{}}
	e.mcp = authmcp.Start(t, e.as.Issuer)
	var err error
	if e.store, err = store.Open(context.Background(), t.TempDir(), store.Options{Key: bytes.Repeat([]byte{7}, 32)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	var h http.Handler = http.NotFoundHandler()
	e.pub = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(e.pub.Close)
	e.b = e.newBroker(t, time.Minute)
	h = e.b.Handler()
	return e
}

// whoami calls the protected server's whoami with header and returns the
// subject it says the token belongs to.
func whoami(t *testing.T, url string, h http.Header) string {
	t.Helper()
	c, err := client.NewStreamableHttpClient(url, transport.WithHTTPHeaders(map[string]string{"Authorization": h.Get("Authorization")}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize with the broker's token: %v", err)
	}
	res, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "whoami"}})
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Sub string }
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	return out.Sub
}

// link has user sign in upstream as account through the link the broker
// gives sub, and checks the page capgate shows.
func (e *env) link(t testing.TB, sub, account string) {
	t.Helper()
	_, err := e.b.Header(context.Background(), sub, "tracker", "")
	var te *tool.Error
	if !errors.As(err, &te) || te.Code != tool.CodeAuthRequired || !strings.HasPrefix(te.AuthURL, e.pub.URL+"/oauth/link/caf_") {
		t.Fatalf("an unlinked caller: %v (%+v), want capability_auth_required with a link", err, te)
	}
	if !strings.Contains(te.Message, te.AuthURL) {
		t.Errorf("the message %q does not carry the link", te.Message)
	}
	status, page := e.as.Visit(t, account, te.AuthURL)
	if status != http.StatusOK || !strings.Contains(page, "<b>"+sub+"</b> is now linked to account <b>"+account+"</b> on <b>tracker</b>") {
		t.Fatalf("callback page %d:\n%s", status, page)
	}
	// The link works once.
	if status, page := e.as.Visit(t, account, te.AuthURL); status != http.StatusBadRequest || !strings.Contains(page, "already used") {
		t.Errorf("the link a second time: %d %s", status, page)
	}
}

func TestLinkCallRefreshRevoke(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.link(t, "alice", "alice-upstream")
	e.link(t, "bob", "bob-upstream")

	ha, err := e.b.Header(ctx, "alice", "tracker", "")
	if err != nil {
		t.Fatal(err)
	}
	hb, err := e.b.Header(ctx, "bob", "tracker", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := whoami(t, e.mcp.URL, ha); got != "alice-upstream" {
		t.Errorf("alice's token is %q's", got)
	}
	if got := whoami(t, e.mcp.URL, hb); got != "bob-upstream" {
		t.Errorf("bob's token is %q's", got)
	}
	st, err := e.b.Status(ctx, "alice", "tracker")
	if err != nil || !st.Linked || st.Account != "alice-upstream" || !st.Refreshable {
		t.Errorf("status %+v, %v", st, err)
	}
	if st, _ := e.b.Status(ctx, "carol", "tracker"); st.Linked {
		t.Errorf("carol, who never linked, is linked: %+v", st)
	}

	// Another replica (another broker on the same store) that refreshes
	// well before expiry gets a new token for alice with her refresh token,
	// and the first replica then uses that one.
	other := e.newBroker(t, 24*time.Hour)
	h2, err := other.Header(ctx, "alice", "tracker", "")
	if err != nil {
		t.Fatal(err)
	}
	if h2.Get("Authorization") == ha.Get("Authorization") {
		t.Fatal("no refresh: the same token")
	}
	if got := whoami(t, e.mcp.URL, h2); got != "alice-upstream" {
		t.Errorf("the refreshed token is %q's", got)
	}
	if h, _ := e.b.Header(ctx, "alice", "tracker", ""); h.Get("Authorization") != h2.Get("Authorization") {
		t.Error("the first replica does not use the token the other refreshed")
	}

	// The upstream refuses the token (401): one refresh gets another.
	e.mcp.Invalidate(strings.TrimPrefix(h2.Get("Authorization"), "Bearer "))
	h3, err := e.b.Header(ctx, "alice", "tracker", h2.Get("Authorization"))
	if err != nil || h3.Get("Authorization") == h2.Get("Authorization") {
		t.Fatalf("after a 401: %v (same token: %v)", err, h3.Get("Authorization") == h2.Get("Authorization"))
	}
	if got := whoami(t, e.mcp.URL, h3); got != "alice-upstream" {
		t.Errorf("the token after the 401 is %q's", got)
	}

	// Revoke: the AS revokes the grant (its refresh token no longer
	// refreshes), the store forgets it, and alice must link again.
	raw, err := e.store.Credential(ctx, "alice", "oauth "+e.as.Issuer, e.mcp.URL)
	if err != nil {
		t.Fatal(err)
	}
	var held struct {
		RefreshToken string `json:"refresh_token"`
		ClientID     string `json:"client_id"`
	}
	json.Unmarshal(raw, &held)
	confirmed, err := e.b.Revoke(ctx, "alice", "tracker")
	if err != nil || !confirmed {
		t.Fatalf("revoke: confirmed %v, %v\n%s", confirmed, err, e.log.String())
	}
	cfg := &oauth2.Config{ClientID: held.ClientID, Endpoint: oauth2.Endpoint{TokenURL: e.as.Issuer + "/token", AuthStyle: oauth2.AuthStyleInParams}}
	if _, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: held.RefreshToken}).Token(); err == nil {
		t.Error("the revoked refresh token still refreshes at the authorization server")
	}
	if _, err := e.b.Header(ctx, "alice", "tracker", ""); tool.ErrorCode(err) != tool.CodeAuthRequired {
		t.Errorf("after revoke: %v, want capability_auth_required", err)
	}
	if got := whoami(t, e.mcp.URL, hb); got != "bob-upstream" {
		t.Errorf("bob after alice's revoke: %q", got)
	}

	// Nothing secret in the log.
	log := e.log.String()
	for _, secret := range append(e.mcp.Tokens(), held.RefreshToken) {
		if secret != "" && strings.Contains(log, secret) {
			t.Errorf("the log carries a token: %s", log)
		}
	}
	if !strings.Contains(log, "upstream account linked") {
		t.Errorf("the log does not say an account was linked:\n%s", log)
	}
}

// TestRefreshRefusedAsksToLinkAgain: a token the upstream keeps refusing
// after the one refresh sends the caller back to sign in.
func TestRefreshRefusedAsksToLinkAgain(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.link(t, "alice", "alice-upstream")
	h, err := e.b.Header(ctx, "alice", "tracker", "")
	if err != nil {
		t.Fatal(err)
	}
	e.mcp.Refuse("alice-upstream", true)
	h2, err := e.b.Header(ctx, "alice", "tracker", h.Get("Authorization"))
	if err != nil {
		t.Fatal(err) // the one refresh
	}
	if h2.Get("Authorization") == h.Get("Authorization") {
		t.Fatal("no refresh after the 401")
	}
	// The refreshed token is refused too.
	err = e.b.Refused(ctx, "alice", "tracker")
	var te *tool.Error
	if !errors.As(err, &te) || te.Code != tool.CodeAuthRequired || te.AuthURL == "" {
		t.Fatalf("refused after a refresh: %v, want capability_auth_required with a link", err)
	}
	if st, _ := e.b.Status(ctx, "alice", "tracker"); st.Linked {
		t.Error("the refused grant is still held")
	}
	e.mcp.Refuse("alice-upstream", false)
	status, _ := e.as.Visit(t, "alice-upstream", te.AuthURL)
	if status != http.StatusOK {
		t.Fatalf("linking again: %d", status)
	}
	h3, err := e.b.Header(ctx, "alice", "tracker", "")
	if err != nil || whoami(t, e.mcp.URL, h3) != "alice-upstream" {
		t.Fatalf("after linking again: %v", err)
	}
}

// TestUserToken: with auth = "user-token" a user enters their own token
// once on the form the link opens; it is sent as the configured header of
// their calls only, and a token the server refuses is forgotten.
func TestUserToken(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir(), store.Options{Key: bytes.Repeat([]byte{9}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var h http.Handler = http.NotFoundHandler()
	pub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	defer pub.Close()
	log := &lockedBuf{}
	b, err := upstreamauth.New(upstreamauth.Options{PublicURL: pub.URL, Store: st,
		Logger:  slog.New(slog.NewTextHandler(log, nil)),
		Servers: []upstreamauth.Server{{Name: "wiki", URL: "http://wiki.invalid/mcp", Mode: upstreamauth.ModeUserToken, Header: "X-Api-Key"}}})
	if err != nil {
		t.Fatal(err)
	}
	h = b.Handler()
	_, err = b.Header(ctx, "alice", "wiki", "")
	var te *tool.Error
	if !errors.As(err, &te) || te.Code != tool.CodeAuthRequired || te.AuthURL == "" {
		t.Fatalf("no token yet: %v", err)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	status, form, _ := oauthas.Get(t, browser, te.AuthURL)
	if status != 200 || !strings.Contains(form, `<b>alice</b>: enter your own token for <b>wiki</b>`) ||
		!strings.Contains(form, `name="token"`) {
		t.Fatalf("the form: %d %s", status, form)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(form)[1]
	const secret = "wiki-personal-token-3f9a1c0e77"
	// Posted from elsewhere (no cookie of the link's page): refused.
	if resp, err := http.PostForm(te.AuthURL, url.Values{"token": {"forged-token-0123456789"}, "csrf": {csrf}}); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a post without the page's cookie: %v %v", resp.StatusCode, err)
	}
	resp, err := browser.PostForm(te.AuthURL, url.Values{"token": {secret}, "csrf": {csrf}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(page), secret) {
		t.Fatalf("after posting the token: %d %s", resp.StatusCode, page)
	}
	got, err := b.Header(ctx, "alice", "wiki", "")
	if err != nil || got.Get("X-Api-Key") != secret || got.Get("Authorization") != "" {
		t.Fatalf("alice's header: %v %v", got, err)
	}
	if _, err := b.Header(ctx, "bob", "wiki", ""); tool.ErrorCode(err) != tool.CodeAuthRequired {
		t.Errorf("bob gets %v, want capability_auth_required", err)
	}
	// The link was used: posting again does nothing.
	if resp, err := browser.PostForm(te.AuthURL, url.Values{"token": {"other-token-value-123456"}, "csrf": {csrf}}); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("posting on a used link: %v %v", resp.StatusCode, err)
	}
	if got, _ := b.Header(ctx, "alice", "wiki", ""); got.Get("X-Api-Key") != secret {
		t.Error("a used link replaced the token")
	}
	// Refused upstream: forgotten, and alice is asked again.
	if _, err := b.Header(ctx, "alice", "wiki", secret); tool.ErrorCode(err) != tool.CodeAuthRequired {
		t.Errorf("a refused token: %v", err)
	}
	if st, _ := b.Status(ctx, "alice", "wiki"); st.Linked {
		t.Error("the refused token is still held")
	}
	if strings.Contains(log.String(), secret) {
		t.Errorf("the log carries the token: %s", log.String())
	}
}

// TestTokenExchange: a caller's own token from the issuer (here, the one
// alice got linking tracker) is exchanged at the issuer (RFC 8693) for a
// token for another server's resource; that server sees alice's account,
// and the caller's own token is not what it gets.
func TestTokenExchange(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.link(t, "alice", "alice-upstream")
	own, err := e.b.Header(ctx, "alice", "tracker", "")
	if err != nil {
		t.Fatal(err)
	}
	wiki := authmcp.Start(t, e.as.Issuer)
	x, err := upstreamauth.New(upstreamauth.Options{Store: e.store,
		Servers: []upstreamauth.Server{{Name: "wiki", URL: wiki.URL, Mode: upstreamauth.ModeTokenExchange}},
		Exchange: upstreamauth.Exchange{Issuer: e.as.Issuer, TokenURL: e.as.Issuer + "/token",
			ClientID: "capgate-exchange", ClientSecret: "exchange-secret-not-for-prod",
			SubjectToken: func(ctx context.Context, _ string) string {
				return strings.TrimPrefix(own.Get("Authorization"), "Bearer ")
			}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := x.Header(ctx, "alice", "wiki", "")
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("Authorization") == own.Get("Authorization") {
		t.Fatal("the caller's own token was passed through")
	}
	if got := whoami(t, wiki.URL, h); got != "alice-upstream" {
		t.Errorf("the exchanged token is %q's", got)
	}
	// Cached until it expires.
	if again, _ := x.Header(ctx, "alice", "wiki", ""); again.Get("Authorization") != h.Get("Authorization") {
		t.Error("exchanged again though the first is live")
	}
	// The caller's own token does not open wiki (it is tracker's).
	if resp := postUnauthorized(t, wiki.URL, own.Get("Authorization")); resp != http.StatusUnauthorized {
		t.Errorf("tracker's token at wiki: %d, want 401", resp)
	}
}

func postUnauthorized(t *testing.T, url, authz string) int {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	req.Header.Set("Authorization", authz)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
