// Package console serves capgate's operator console: server-rendered pages
// (html/template, with htmx vendored and embedded) for the approvals queue,
// the audit log, the catalog, linked accounts and live state, on a listener
// of its own.
//
// Everything it shows may come from someone hostile (tool names and
// descriptions from upstreams, call inputs, subjects from tokens), so every
// value is rendered by html/template as text, and the Content-Security-Policy
// allows no inline script. Pages work without JavaScript; htmx only
// refreshes the approvals queue when the server says it changed.
package console

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

//go:embed static templates
var assets embed.FS

// Approval is one request for an operator's decision, as the console
// shows it.
type Approval struct {
	ID, Sub, ToolID      string
	CreatedAt, ExpiresAt time.Time
	Input                []byte // canonical input, perhaps cut
	InputSize            int
	Approved, Denied     bool
	ApprovedBy, DeniedBy string
	Note                 string
}

// Approvals is the store's approvals, as the console needs them.
type Approvals interface {
	// Live lists the live approvals (not used, not expired), newest first.
	Live(ctx context.Context) ([]Approval, error)
	Approve(ctx context.Context, id, by, note string) error
	Deny(ctx context.Context, id, by, note string) error
}

// Account is one upstream account a user linked.
type Account struct {
	Sub, Server, Issuer string
	Expires             time.Time
}

// Accounts lists and revokes users' upstream accounts; nil when capgate has
// no upstream that needs a user's sign-in.
type Accounts interface {
	List(ctx context.Context) ([]Account, error)
	Revoke(ctx context.Context, sub, server string) error
}

// Live is this replica's state, for the live page.
type Live struct {
	Ready    string // "" when ready, else why not
	Sessions []Session
	InFlight []InFlight
	Sources  []SourceState
}

// Session is an MCP session held now (protocol 2025-11-25 and earlier;
// 2026-07-28 has none).
type Session struct {
	Sub, Protocol string
	LastUsed      time.Time
}

// InFlight is a call running now: held for an approval, or running.
type InFlight struct {
	RequestID, Sub, Tool, Protocol string
	Started                        time.Time
}

// SourceState is one tool source, up or down.
type SourceState struct {
	Key, Reason string
	Up          bool
	Tools       int
}

// Options configures a console. Approvals, Catalog and Key are required.
type Options struct {
	Approvals Approvals
	// Catalog is the catalog now (a reload swaps it).
	Catalog func() []*tool.Descriptor
	// Tier names the tier of a risk level ("unrestricted"); may be nil.
	Tier func(risk.Level) string
	// AuditPath is the audit log the audit page indexes; Verify says what
	// `capgate audit verify` says of it.
	AuditPath string
	Verify    func() (report string, ok bool)
	Accounts  Accounts    // may be nil
	Pins      Pins        // may be nil: no review of quarantined tools
	Live      func() Live // may be nil
	Roles     Roles
	// Key is a secret of capgate's own from which the console derives its
	// cookie and sign-in link keys.
	Key []byte
	// Secure marks cookies Secure: the console is reached over TLS.
	Secure bool
	// ClaimOnce consumes a sign-in link's nonce once across replicas.
	ClaimOnce func(ctx context.Context, key string, expires time.Time) error
	// OIDC signs operators in with the configured OpenID provider; nil: only
	// sign-in links.
	OIDC *OIDC
	// Record writes an operator's action to the audit log.
	Record func(audit.Event)
	Logger *slog.Logger
	Now    func() time.Time
	// PollInterval is how often the approvals stream looks for changes.
	PollInterval time.Duration
}

// Console is the console's HTTP handler.
type Console struct {
	opts   Options
	pages  map[string]*template.Template
	mux    *http.ServeMux
	keys   keys
	audit  *auditIndex
	static http.Handler
}

// New builds a console.
func New(opts Options) (*Console, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Record == nil {
		opts.Record = func(audit.Event) {}
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	static, _ := fs.Sub(assets, "static")
	c := &Console{opts: opts, pages: pages, mux: http.NewServeMux(), keys: deriveKeys(opts.Key),
		audit: newAuditIndex(opts.AuditPath), static: staticFiles(static)}
	c.routes()
	return c, nil
}

// staticFiles serves the embedded files with an ETag of their content and
// Cache-Control: no-cache: embedded files have no modification time, so
// without one the browser fetches and compiles htmx again on every page;
// with it, it asks, gets 304 and reuses what it compiled, and still never
// keeps a file an upgrade replaced.
func staticFiles(static fs.FS) http.Handler {
	tags := map[string]string{}
	fs.WalkDir(static, ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, err := fs.ReadFile(static, path); err == nil {
				sum := sha256.Sum256(b)
				tags[path] = `"` + hex.EncodeToString(sum[:12]) + `"`
			}
		}
		return nil
	})
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tag, ok := tags[r.URL.Path]; ok {
			w.Header().Set("ETag", tag)
			w.Header().Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}

func (c *Console) routes() {
	m := c.mux
	m.Handle("GET /static/", http.StripPrefix("/static/", c.static))
	m.HandleFunc("GET /signin", c.signinPage)
	m.HandleFunc("GET /login", c.linkLogin)
	m.HandleFunc("GET /oidc/start", c.oidcStart)
	m.HandleFunc("GET /oidc/callback", c.oidcCallback)
	m.HandleFunc("POST /logout", c.need(viewer, c.logout))
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/approvals", http.StatusSeeOther)
	})
	m.HandleFunc("GET /approvals", c.need(viewer, c.approvalsPage))
	m.HandleFunc("GET /approvals/list", c.need(viewer, c.approvalsList))
	m.HandleFunc("GET /approvals/events", c.need(viewer, c.approvalsEvents))
	m.HandleFunc("POST /approvals/{id}/{action}", c.need(approver, c.decide))
	m.HandleFunc("GET /audit", c.need(viewer, c.auditPage))
	m.HandleFunc("GET /audit/record/{seq}", c.need(viewer, c.auditRecord))
	m.HandleFunc("GET /audit/verify", c.need(viewer, c.auditVerify))
	m.HandleFunc("GET /catalog", c.need(viewer, c.catalogPage))
	m.HandleFunc("POST /catalog/pin", c.need(approver, c.pinTool))
	m.HandleFunc("GET /accounts", c.need(viewer, c.accountsPage))
	m.HandleFunc("POST /accounts/revoke", c.need(approver, c.revokeAccount))
	m.HandleFunc("GET /live", c.need(viewer, c.livePage))
}

// ServeHTTP serves the console, behind the DNS-rebinding check and the
// security headers every response carries.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && isLoopbackAddr(a) && !isLoopbackHost(r.Host) {
		http.Error(w, "Forbidden: invalid Host header", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// isLoopbackAddr says whether a listener's address is a loopback one.
func isLoopbackAddr(a net.Addr) bool {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// isLoopbackHost says whether a Host header names this machine's loopback:
// localhost or a loopback address, with or without a port.
func isLoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// pretty indents a JSON document for reading; what does not parse is shown
// as it is.
func pretty(raw []byte) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	// html/template escapes what it shows: the JSON keeps <, > and & as
	// they are, for the operator to read.
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
