// Package upstreamauth is capgate as the OAuth client of the remote MCP
// servers that need each user's own account, as the MCP authorization
// specification describes: it discovers a server's authorization server
// (RFC 9728, RFC 8414, OpenID discovery), registers as its client (a
// configured client id, a Client ID Metadata Document served under
// public_url, or dynamic registration, RFC 7591), sends each user through
// the authorization code flow with PKCE S256 and the resource parameter
// (RFC 8707), and keeps each user's tokens, encrypted in the store under
// (subject, issuer, resource), refreshed before they expire, revoked on
// request. It also gets tokens by token exchange (RFC 8693) and keeps
// per-user secrets entered on a form.
//
// Every token, refresh token, client secret and PKCE verifier stays inside
// this package and the store: none is returned to a caller, logged or put
// in an error.
package upstreamauth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// Mode is how a server's requests are authorized.
type Mode string

const (
	ModeOAuth         Mode = "oauth"
	ModeTokenExchange Mode = "token-exchange"
	ModeUserToken     Mode = "user-token"
)

// Server is one upstream whose requests carry each caller's credential.
type Server struct {
	Name         string // its [mcp.servers.NAME]
	URL          string // the MCP endpoint
	Mode         Mode
	ClientID     string   // a pre-registered client; "" to register
	ClientSecret string   // with ClientID, for a confidential client
	Scopes       []string // "" to use what the server's metadata says
	// Header is what a user token is sent as (user-token mode); default
	// Authorization, as "Bearer <token>".
	Header string
}

// Store is what the broker keeps in capgate's store: credentials (the
// encrypted vault) and auth flows.
type Store interface {
	PutCredential(ctx context.Context, sub, capabilityID, accountRef string, material []byte) error
	Credential(ctx context.Context, sub, capabilityID, accountRef string) ([]byte, error)
	DeleteCredential(ctx context.Context, sub, capabilityID, accountRef string) error
	BeginFlow(ctx context.Context, sub, capabilityID, accountHint string, state []byte) (*store.Flow, error)
	FlowByID(ctx context.Context, id string) (*store.Flow, error)
	TakeFlowByID(ctx context.Context, id string) (*store.Flow, error)
	CredentialSubjects(ctx context.Context, capabilityID, accountRef string, limit int) ([]string, error)
}

// Options configure a Broker.
type Options struct {
	// PublicURL is where users' browsers reach capgate: the redirect URI
	// is PublicURL/oauth/callback.
	PublicURL string
	Servers   []Server
	Store     Store
	// HTTPClient reaches upstreams and authorization servers; default a
	// client with a 30 s timeout.
	HTTPClient *http.Client
	Logger     *slog.Logger
	Now        func() time.Time
	// RefreshBefore is how long before expiry a token is refreshed;
	// default one minute.
	RefreshBefore time.Duration
	// Exchange configures token exchange (ModeTokenExchange).
	Exchange Exchange
	// SignIn, when set, has a link page sign the browser in at capgate's
	// own OpenID provider and go on only for the link's subject
	// (signin.go). nil: whoever opens a link can complete it.
	SignIn *SignIn
}

// Broker holds each user's credentials for each server.
type Broker struct {
	opts Options
	http *http.Client
	// servers, by name: replaced whole by Reconfigure (a reload).
	servers atomic.Pointer[map[string]*Server]

	mu    sync.Mutex
	found map[string]*found // discovery, by server name
	// busy serializes refreshes per (sub, server) in this process.
	busy map[string]*sync.Mutex
	// exchanged caches token-exchange results by (sub, server).
	exchanged map[string]exchanged
	onLinked  atomic.Pointer[func(server string)]
	// waiting are the calls waiting for a user to link (WaitLinked), by
	// sub and server.
	waiting map[string]map[chan struct{}]struct{}
	signIn  signInParty // with opts.SignIn
}

// SetOnLinked has f told, after the callback stored a token, that a user
// linked an account on server.
func (b *Broker) SetOnLinked(f func(server string)) { b.onLinked.Store(&f) }

// linked is told that sub linked an account on server here: the hook,
// and the calls waiting for it in this process.
func (b *Broker) linked(sub, server string) {
	b.wake(sub, server)
	if f := b.onLinked.Load(); f != nil {
		(*f)(server)
	}
}

// found is a discovery result and when it was made.
type found struct {
	up *upstream
	at time.Time
}

// discoveryTTL is how long a discovery result is reused.
const discoveryTTL = time.Hour

// New returns a broker for servers.
func New(opts Options) (*Broker, error) {
	if opts.Store == nil {
		return nil, errors.New("upstreamauth: no store")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RefreshBefore <= 0 {
		opts.RefreshBefore = time.Minute
	}
	opts.PublicURL = strings.TrimSuffix(opts.PublicURL, "/")
	b := &Broker{opts: opts, http: opts.HTTPClient, found: map[string]*found{}, busy: map[string]*sync.Mutex{}}
	if b.http == nil {
		b.http = &http.Client{Timeout: 30 * time.Second}
	}
	if err := b.Reconfigure(opts.Servers); err != nil {
		return nil, err
	}
	return b, nil
}

// Reconfigure replaces the servers the broker serves (a config reload).
// Accounts stay in the store: a server configured again under the same
// URL finds its users' links. What was discovered of a server whose
// settings changed, or that is gone, is forgotten. On error nothing
// changed.
func (b *Broker) Reconfigure(servers []Server) error {
	next := make(map[string]*Server, len(servers))
	for i := range servers {
		s := servers[i]
		switch s.Mode {
		case ModeOAuth, ModeUserToken:
			if b.opts.PublicURL == "" {
				return fmt.Errorf("upstreamauth: server %s: auth %q needs server.public_url", s.Name, s.Mode)
			}
		case ModeTokenExchange:
			if b.opts.Exchange.Issuer == "" {
				return fmt.Errorf("upstreamauth: server %s: auth %q needs [auth.oidc] (its issuer's token endpoint)", s.Name, s.Mode)
			}
		default:
			return fmt.Errorf("upstreamauth: server %s: unknown auth %q", s.Name, s.Mode)
		}
		next[s.Name] = &s
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if prev := b.servers.Load(); prev != nil {
		for name, old := range *prev {
			if now, ok := next[name]; !ok || !reflect.DeepEqual(*old, *now) {
				delete(b.found, name)
				for key := range b.exchanged {
					if strings.HasSuffix(key, "\x00"+name) {
						delete(b.exchanged, key)
					}
				}
			}
		}
	}
	b.servers.Store(&next)
	return nil
}

// server is the configured server name.
func (b *Broker) server(name string) (*Server, bool) {
	s, ok := (*b.servers.Load())[name]
	return s, ok
}

// names are the configured servers' names, sorted.
func (b *Broker) names() []string {
	return slices.Sorted(maps.Keys(*b.servers.Load()))
}

// Servers lists the servers the broker serves, by name.
func (b *Broker) Server(name string) (*Server, bool) { return b.server(name) }

// RedirectURI is the callback the authorization servers send users back to.
func (b *Broker) RedirectURI() string { return b.opts.PublicURL + CallbackPath }

// upstreamOf discovers srv once per discoveryTTL.
func (b *Broker) upstreamOf(ctx context.Context, srv *Server) (*upstream, error) {
	b.mu.Lock()
	f := b.found[srv.Name]
	b.mu.Unlock()
	if f != nil && b.opts.Now().Sub(f.at) < discoveryTTL {
		return f.up, nil
	}
	up, err := b.discover(ctx, srv)
	if err != nil {
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: finding its authorization server: %v", srv.Name, err)
	}
	b.mu.Lock()
	b.found[srv.Name] = &found{up: up, at: b.opts.Now()}
	b.mu.Unlock()
	return up, nil
}

// grant is what the store holds for one user on one (issuer, resource).
type grant struct {
	Server       string    `json:"server"`
	AccessToken  string    `json:"access_token,omitempty"`
	RefreshToken string    `json:"refresh_token,omitempty"`
	TokenType    string    `json:"token_type,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	ClientID     string    `json:"client_id,omitempty"`
	Account      string    `json:"account,omitempty"` // the user's account upstream, when known
	LinkedAt     time.Time `json:"linked_at"`
	// Secret is a user token (user-token mode).
	Secret string `json:"secret,omitempty"`
}

// Credential keys: capability id "oauth <issuer>", account ref the
// resource; user tokens under "user-token", the server's URL.
func tokenKey(up *upstream) (string, string) { return "oauth " + up.Issuer, up.Resource }

func userTokenKey(srv *Server) (string, string) { return "user-token", srv.URL }

func (b *Broker) load(ctx context.Context, sub, capID, ref string) (*grant, error) {
	raw, err := b.opts.Store.Credential(ctx, sub, capID, ref)
	if err != nil {
		return nil, err
	}
	var g grant
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, fmt.Errorf("the stored grant is not JSON: %w", err)
	}
	return &g, nil
}

func (b *Broker) save(ctx context.Context, sub, capID, ref string, g *grant) error {
	raw, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return b.opts.Store.PutCredential(ctx, sub, capID, ref, raw)
}

// lock serializes the refreshes of one key in this process.
func (b *Broker) lock(key string) func() {
	b.mu.Lock()
	m := b.busy[key]
	if m == nil {
		m = &sync.Mutex{}
		b.busy[key] = m
	}
	b.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// NeedLink is the refusal of a call whose caller has no usable
// credential for the server: it carries the link that fixes it.
func (b *Broker) needLink(ctx context.Context, sub string, srv *Server, why string) error {
	link, _, err := b.Begin(ctx, sub, srv.Name)
	if err != nil {
		return err
	}
	return &tool.Error{Code: tool.CodeAuthRequired, Gate: "upstream_auth", Required: "mcp:" + srv.Name,
		Message: fmt.Sprintf("mcp server %s needs you to sign in with your own account (%s): open %s", srv.Name, why, link),
		Hint:    "open the link in a browser and sign in, then call again", AuthURL: link}
}

// Header returns the header that carries sub's credential to server, or
// a capability_auth_required error whose AuthURL is the link to sign in.
// stale, when set, is a header value the server just refused with 401:
// the token is refreshed once, and if that is refused too the caller is
// asked to sign in again.
func (b *Broker) Header(ctx context.Context, sub, server, stale string) (http.Header, error) {
	srv, ok := b.server(server)
	if !ok {
		return nil, fmt.Errorf("upstreamauth: no server %q", server)
	}
	if sub == "" {
		return nil, &tool.Error{Code: tool.CodeAuthRequired, Gate: "upstream_auth", Required: "mcp:" + server,
			Message: fmt.Sprintf("mcp server %s acts as each caller's own account: an anonymous caller has none", server)}
	}
	switch srv.Mode {
	case ModeUserToken:
		return b.userTokenHeader(ctx, sub, srv, stale)
	case ModeTokenExchange:
		return b.exchangeHeader(ctx, sub, srv, stale)
	}
	up, err := b.upstreamOf(ctx, srv)
	if err != nil {
		return nil, err
	}
	capID, ref := tokenKey(up)
	g, err := b.load(ctx, sub, capID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, b.needLink(ctx, sub, srv, "no account linked")
	}
	if err != nil {
		return nil, storeError(srv, err)
	}
	if stale == "" && g.AccessToken != "" && (g.Expiry.IsZero() || b.opts.Now().Add(b.opts.RefreshBefore).Before(g.Expiry)) {
		return bearer(g.AccessToken), nil
	}
	g, err = b.refresh(ctx, sub, srv, up, stale)
	if err != nil {
		return nil, err
	}
	return bearer(g.AccessToken), nil
}

// Refused is what a caller is told when the server refused even the
// token Header gave after a refresh: the grant is forgotten, and the
// caller is asked to sign in again.
func (b *Broker) Refused(ctx context.Context, sub, server string) error {
	srv, ok := b.server(server)
	if !ok {
		return fmt.Errorf("upstreamauth: no server %q", server)
	}
	var capID, ref string
	switch srv.Mode {
	case ModeUserToken:
		capID, ref = userTokenKey(srv)
	case ModeTokenExchange:
		b.forgetExchanged(sub, server)
		return &tool.Error{Code: tool.CodeAccessDenied, Gate: "upstream_auth", Required: "mcp:" + srv.Name,
			Message: "mcp server " + srv.Name + " refused the token exchanged for yours"}
	default:
		up, err := b.upstreamOf(ctx, srv)
		if err != nil {
			return err
		}
		capID, ref = tokenKey(up)
	}
	if err := b.opts.Store.DeleteCredential(ctx, sub, capID, ref); err != nil && !errors.Is(err, store.ErrNotFound) {
		return storeError(srv, err)
	}
	b.opts.Logger.Info("the upstream refused the user's token after a refresh; asking them to sign in again", "server", srv.Name, "sub", sub)
	return b.needLink(ctx, sub, srv, "the server refused your token")
}

// ListerHeader is the header of requests made for no caller (the
// upstream session capgate lists a server's tools on): the credential of
// the user who most recently linked an account there. One user's listing
// stands for everyone's; every call still carries the caller's own.
// Before anyone links, capability_auth_required.
func (b *Broker) ListerHeader(ctx context.Context, server string) (http.Header, error) {
	srv, ok := b.server(server)
	if !ok {
		return nil, fmt.Errorf("upstreamauth: no server %q", server)
	}
	var capID, ref string
	switch srv.Mode {
	case ModeTokenExchange:
		return b.exchangeListerHeader(ctx, srv)
	case ModeUserToken:
		capID, ref = userTokenKey(srv)
	case ModeOAuth:
		up, err := b.upstreamOf(ctx, srv)
		if err != nil {
			return nil, err
		}
		capID, ref = tokenKey(up)
	}
	var subs []string
	if capID != "" {
		var err error
		if subs, err = b.opts.Store.CredentialSubjects(ctx, capID, ref, 3); err != nil {
			return nil, storeError(srv, err)
		}
	}
	for _, sub := range subs {
		if h, err := b.Header(ctx, sub, server, ""); err == nil {
			return h, nil
		}
	}
	return nil, tool.Errorf(tool.CodeAuthRequired, "mcp server %s lists its tools only to a signed-in user, and no one has signed in yet: "+
		"capgate accounts link %s --sub SUBJECT", srv.Name, srv.Name)
}

func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

func storeError(srv *Server, err error) error {
	return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: the linked account could not be read", srv.Name)
}

// refresh gets sub a fresh access token with the refresh token: once per
// key at a time in this process, and after reading the store again, so
// that a token another replica refreshed meanwhile is used, not refreshed
// twice (a rotated refresh token works once).
func (b *Broker) refresh(ctx context.Context, sub string, srv *Server, up *upstream, stale string) (*grant, error) {
	capID, ref := tokenKey(up)
	defer b.lock(sub + "\x00" + capID + "\x00" + ref)()
	g, err := b.load(ctx, sub, capID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, b.needLink(ctx, sub, srv, "no account linked")
	}
	if err != nil {
		return nil, storeError(srv, err)
	}
	fresh := g.AccessToken != "" && (g.Expiry.IsZero() || b.opts.Now().Add(b.opts.RefreshBefore).Before(g.Expiry))
	if fresh && (stale == "" || "Bearer "+g.AccessToken != stale) {
		return g, nil // refreshed meanwhile
	}
	if g.RefreshToken == "" {
		return nil, b.needLink(ctx, sub, srv, "the token expired and there is no refresh token")
	}
	reg, err := b.client(ctx, srv, up, g.ClientID)
	if err != nil {
		return nil, err
	}
	tok, err := reg.config(up, b.RedirectURI()).TokenSource(b.oauthContext(ctx, up), &oauth2.Token{RefreshToken: g.RefreshToken}).Token()
	if err != nil {
		// Another replica may have rotated the refresh token a moment ago.
		if again, lerr := b.load(ctx, sub, capID, ref); lerr == nil && again.RefreshToken != g.RefreshToken &&
			again.AccessToken != "" && b.opts.Now().Before(again.Expiry) {
			return again, nil
		}
		b.opts.Logger.Info("upstream token refresh refused; the user must sign in again", "server", srv.Name, "sub", sub, "reason", oauthReason(err))
		if derr := b.opts.Store.DeleteCredential(ctx, sub, capID, ref); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			return nil, storeError(srv, derr)
		}
		return nil, b.needLink(ctx, sub, srv, "the authorization server refused to refresh the token")
	}
	g.AccessToken, g.TokenType, g.Expiry = tok.AccessToken, tok.TokenType, tok.Expiry
	if tok.RefreshToken != "" {
		g.RefreshToken = tok.RefreshToken
	}
	if err := b.save(ctx, sub, capID, ref, g); err != nil {
		return nil, storeError(srv, err)
	}
	return g, nil
}

// oauthReason is what may be logged of an OAuth error: its error code,
// never the response body.
func oauthReason(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		if re.ErrorCode != "" {
			return re.ErrorCode
		}
		if re.Response != nil {
			return re.Response.Status
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return "unreachable: " + ue.Op
	}
	return "failed"
}

// oauthContext is ctx for golang.org/x/oauth2 token requests: the broker's
// HTTP client, adding the resource parameter (RFC 8707) to every token
// request for up, which x/oauth2 has no option for on refresh.
func (b *Broker) oauthContext(ctx context.Context, up *upstream) context.Context {
	c := *b.http
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = &resourceParam{next: next, tokenURL: up.TokenEndpoint, resource: up.Resource}
	return context.WithValue(ctx, oauth2.HTTPClient, &c)
}

// resourceParam adds resource to form posts to tokenURL that lack it.
type resourceParam struct {
	next     http.RoundTripper
	tokenURL string
	resource string
}

func (t *resourceParam) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.URL.String() != t.tokenURL || r.Body == nil || r.GetBody == nil {
		return t.next.RoundTrip(r)
	}
	body, err := r.GetBody()
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(body)
	body.Close()
	if err != nil {
		return nil, err
	}
	form, err := url.ParseQuery(string(raw))
	if err != nil || form.Has("resource") {
		return t.next.RoundTrip(r)
	}
	form.Set("resource", t.resource)
	enc := form.Encode()
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(strings.NewReader(enc)), int64(len(enc))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(enc)), nil }
	return t.next.RoundTrip(r2)
}

// newID is 128 random bits in hex.
func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}
