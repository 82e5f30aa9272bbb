// Package mcp is the tool source for upstream MCP servers, through the
// mcp-go client over stdio, streamable HTTP or SSE. Tool lists are read raw
// so input schemas pass through byte for byte; a lost upstream is
// reconnected with capped exponential backoff while its tools show as
// unavailable.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// Protocol is the MCP revision capgate speaks to upstreams: the session
// protocol, which every server of today understands.
const Protocol = "2025-11-25"

// pooledTransport keeps enough idle connections per upstream that
// concurrent calls reuse them: net/http's default of two per host makes most calls
// under load open a new TCP connection.
var (
	pooledTransport = &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	pooledClient = &http.Client{Transport: pooledTransport}
)

// Options describe one upstream.
type Options struct {
	Name string // the source id

	Command string
	Args    []string
	Env     map[string]string // added to proc.BaseEnv
	Cwd     string
	// Confine is what a stdio server's process guarantees; the zero
	// value, nothing.
	Confine sandbox.Confinement

	URL       string
	Transport string // "streamable-http" (default for URL) or "sse"
	// Protocol pins the revision spoken to a streamable-HTTP upstream:
	// "" tries Modern (2026-07-28) and falls back to the handshake of
	// Protocol (2025-11-25); Protocol never tries Modern. stdio and SSE
	// upstreams speak Protocol.
	Protocol string
	Headers  map[string]string

	// TrustAnnotations: the operator vouches for the server's tool
	// annotations, so they may lower the inferred risk (risk.Hints).
	TrustAnnotations bool

	// Hooks vary requests by caller: headers per request, a session per
	// caller (see hooks.go).
	Hooks Hooks

	Timeout time.Duration // per request; default 60s
	// MaxMessage bounds one message from the upstream (a result above all);
	// default DefaultMaxMessage. A longer one is refused with
	// capability_invalid_output, and a stdio upstream is restarted.
	MaxMessage int64
	// Backoff bounds reconnection: it starts at MinBackoff and doubles up
	// to MaxBackoff. Defaults 200ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	Logger                 *slog.Logger
	LookupEnv              func(string) (string, bool)
}

// Source is one upstream MCP server.
type Source struct {
	opts Options
	// launch is a stdio server's pin (sandbox.Launch), nil for a URL.
	launch json.RawMessage

	mu       sync.Mutex
	conn     *link // nil while disconnected
	lastErr  error
	retrying bool
	closed   bool
	stop     chan struct{}
	wake     chan struct{}   // Retry: try to reconnect now
	life     context.Context // ends at Close
	end      context.CancelFunc

	seq      atomic.Int64 // numbers list request ids and progress tokens
	progress sync.Map     // progress token → func(progress, total, message)
	// listed holds the tool names of the last whole tools/list, so a call
	// of any other is capability_not_found, not an upstream failure; nil
	// until a list succeeds, when calls go to the upstream unchecked.
	listed atomic.Pointer[map[string]bool]
	// callHeads are the standard headers of a tools/call of each listed
	// tool (Mcp-Method, Mcp-Name), made once per list: mcp-go derives
	// them by decoding the call's params, a cost on every call.
	callHeads atomic.Pointer[map[string]http.Header]

	keyed keyed // the sessions of Hooks.SessionKey

	// stderr is the tail of the newest stdio process's stderr, shown
	// (bounded, scrubbed) when it fails to start or to initialize.
	stderr atomic.Pointer[proc.Tail]
	// denied are the denials of the newest stdio process (denials.go).
	denied atomic.Pointer[procDenials]

	// subs are the resource URIs subscribed at the upstream, and
	// subsSet is closed (then replaced) when they change (listen.go).
	subMu   sync.Mutex
	subs    map[string]bool
	subsSet chan struct{}

	changeMu sync.Mutex
	onChange []func()
	onNotify []func(method string, params json.RawMessage)
}

// link is one live connection to the upstream.
type link struct {
	c *client.Client
	// For streamable HTTP, tools/call is posted directly (see http.go)
	// with the session mcp-go's client opened.
	http    bool
	session string
	version string
	caps    mcpgo.ServerCapabilities
	// post is the head of every POST on the link, made once: a call
	// copies it (sharing its URL and Header, which nothing writes).
	post *http.Request
	// callHeads are, by tool name, post's header with the standard
	// headers of a tools/call of that tool (callHead): made once per tool,
	// shared by its calls, written by no one.
	callHeads sync.Map
	// guard is the limit on a stdio upstream's messages: over it, the
	// connection is replaced (see restart).
	guard *guard
	// key is the Hooks.SessionKey this link serves; "" for the shared one.
	key string
	// base are the hook's headers at dial, for what mcp-go sends without
	// a request's context (the standalone stream).
	base http.Header
	// owners are the calls in flight here, for what the upstream sends
	// outside their streams on a keyed link.
	owners owners
	// acked: the upstream acknowledged the subscriptions/listen stream
	// open now (listen.go).
	acked atomic.Bool
}

var (
	_ tool.Source   = (*Source)(nil)
	_ tool.Notifier = (*Source)(nil)
	_ tool.Closer   = (*Source)(nil)
)

// New returns a source; Connect starts it.
func New(opts Options) (*Source, error) {
	if opts.Name == "" {
		return nil, errors.New("mcp source: name is required")
	}
	if (opts.Command == "") == (opts.URL == "") {
		return nil, fmt.Errorf("mcp server %s: give exactly one of command and url", opts.Name)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.MaxMessage <= 0 {
		opts.MaxMessage = DefaultMaxMessage
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Transport == "" && opts.URL != "" {
		opts.Transport = "streamable-http"
	}
	life, end := context.WithCancel(context.Background())
	src := &Source{opts: opts, stop: make(chan struct{}), wake: make(chan struct{}, 1), life: life, end: end}
	if opts.Command != "" {
		// Pinned by capgate.lock with each of its tools: the program as
		// it is when the source is built (at start and at each reload).
		l := opts.Confine.Launch(append([]string{opts.Command}, opts.Args...), opts.Cwd)
		l.Cwd = opts.Cwd
		src.launch = l.JSON()
	}
	return src, nil
}

func (s *Source) ID() string { return s.opts.Name }

// Launch is what capgate.lock pins of a stdio server's process
// (sandbox.Launch), nil for a URL.
func (s *Source) Launch() json.RawMessage { return s.launch }
func (s *Source) Kind() tool.Kind         { return tool.KindMCP }

// OnChange registers f for tools/list_changed and for reconnections.
func (s *Source) OnChange(f func()) {
	s.changeMu.Lock()
	s.onChange = append(s.onChange, f)
	s.changeMu.Unlock()
}

// OnNotification registers f for the upstream's notifications that are
// not about one call (resources/updated, resources/list_changed, ...).
func (s *Source) OnNotification(f func(method string, params json.RawMessage)) {
	s.changeMu.Lock()
	s.onNotify = append(s.onNotify, f)
	s.changeMu.Unlock()
}

// Capabilities returns what the upstream said it serves, or false while
// it is not connected.
func (s *Source) Capabilities() (mcpgo.ServerCapabilities, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return mcpgo.ServerCapabilities{}, false
	}
	return s.conn.caps, true
}

func (s *Source) changed() {
	s.changeMu.Lock()
	fs := slices.Clone(s.onChange)
	s.changeMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Connect connects to the upstream. When that fails the source keeps
// retrying in the background and Connect returns the first error; the
// source is still usable, its tools unavailable until it connects.
func (s *Source) Connect(ctx context.Context) error {
	err := s.dial(ctx)
	if err != nil {
		s.lost(err)
	}
	return err
}

func (s *Source) dial(ctx context.Context) error {
	l, err := s.open(ctx, "", false)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.c.Close()
		return errors.New("source closed")
	}
	s.conn, s.lastErr = l, nil
	s.mu.Unlock()
	s.closeKeyed()
	l.guard.whenTripped(func() { go s.restart(l) })
	if l.modern() {
		go s.listen(l)
	}
	return nil
}

// open connects and initializes one link: the shared one (key "") or the
// session of a SessionKey; legacy, at Protocol whatever the upstream
// speaks. ctx carries the caller the link is for, whose
// hook headers it keeps for its standalone stream.
func (s *Source) open(ctx context.Context, key string, legacy bool) (*link, error) {
	l := &link{key: key, guard: newGuard()}
	if s.opts.Hooks.Headers != nil && s.opts.Transport != "sse" && s.opts.Command == "" {
		var err error
		if ctx, err = s.withHeaders(ctx, nil); err != nil {
			return nil, err
		}
		l.base, _ = ctx.Value(headersKey{}).(http.Header)
	}
	g := l.guard
	// Over streamable HTTP, the stateless protocol first; an upstream that
	// does not speak it gets a new connection for the handshake, with the
	// standalone stream the stateless protocol has no use for.
	modern := s.opts.Command == "" && s.opts.Transport != "sse" && s.opts.Protocol != Protocol && !legacy
	c, err := s.newClient(g, &l.base, modern)
	if err != nil {
		return nil, err
	}
	if modern {
		err := s.handshake(ctx, l, c, Modern)
		if err != nil || l.modern() {
			return l, err
		}
		// The upstream took the handshake: keep none of this connection.
		c.Close()
		if c, err = s.newClient(g, &l.base, false); err != nil {
			return nil, err
		}
	}
	return l, s.handshake(ctx, l, c, Protocol)
}

// handshake starts c and opens the connection at version (Modern tries
// server/discover and falls back to initialize; Protocol initializes),
// filling in l from the upstream's answer.
func (s *Source) handshake(ctx context.Context, l *link, c *client.Client, version string) error {
	l.c = c
	c.OnNotification(func(n mcpgo.JSONRPCNotification) { s.notification(l, n) })
	// A stdio upstream's process lives as long as the context Start gets,
	// so that is the source's life, not this dial's deadline.
	if err := c.Start(s.life); err != nil {
		c.Close()
		return fmt.Errorf("mcp server %s: start: %w%s%s", s.opts.Name, err, s.stderrTail(), s.denialNote())
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = version
	init.Params.ClientInfo = clientInfo
	// capgate relays these requests to the client whose call caused them.
	init.Params.Capabilities = mcpgo.ClientCapabilities{
		Sampling:    &mcpgo.SamplingCapability{},
		Elicitation: &mcpgo.ElicitationCapability{Form: &struct{}{}, URL: &struct{}{}},
	}
	if version == Modern {
		init.Params.Capabilities = clientCaps
	}
	res, err := c.Initialize(ctx, init)
	if err != nil {
		c.Close() // waits for the process, so its stderr is whole
		return fmt.Errorf("mcp server %s: initialize: %w%s%s", s.opts.Name, err, s.stderrTail(), s.denialNote())
	}
	l.version, l.caps = res.ProtocolVersion, res.Capabilities
	if l.modern() {
		l.http = true
		if l.post, err = s.newRequest(context.Background(), l, nil, ""); err != nil {
			c.Close()
			return fmt.Errorf("mcp server %s: %w", s.opts.Name, err)
		}
		c.OnConnectionLost(func(err error) { s.drop(l, err) })
		return nil
	}
	if version == Modern {
		return nil // the caller starts over at Protocol
	}
	if t, ok := c.GetTransport().(*transport.StreamableHTTP); ok {
		l.http, l.session = true, t.GetSessionId()
		if l.post, err = s.newRequest(context.Background(), l, nil, ""); err != nil {
			c.Close()
			return fmt.Errorf("mcp server %s: %w", s.opts.Name, err)
		}
	}
	// Requests the upstream makes outside capgate's own streams (stdio,
	// SSE, the standalone stream) are matched to a call here.
	if bt, ok := c.GetTransport().(transport.BidirectionalInterface); ok {
		bt.SetRequestHandler(func(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
			return s.serverRequest(ctx, l, req)
		})
	}
	if res.Capabilities.Logging != nil {
		// Every level comes up; each client's own level filters it.
		setLevel := mcpgo.SetLevelRequest{}
		setLevel.Params.Level = mcpgo.LoggingLevelDebug
		if err := c.SetLevel(ctx, setLevel); err != nil {
			s.opts.Logger.Debug("upstream refused logging/setLevel", "server", s.opts.Name, "err", err)
		}
	}
	c.OnConnectionLost(func(err error) { s.drop(l, err) })
	return nil
}

// stderrTail is "; its stderr ends: ..." for a stdio upstream that wrote
// to stderr before failing, "" otherwise: a server refused by its sandbox
// (a script it may not read) says why there, and the operator and the
// caller see it, bounded and with credentials withheld.
func (s *Source) stderrTail() string {
	t := s.stderr.Load()
	if t == nil {
		return ""
	}
	if tail := proc.Reported(t.String()); tail != "" {
		return "; its stderr ends: " + tail
	}
	return ""
}

// restart replaces l, whose stream a message over the limit put out of
// step, with a new connection at once (the upstream is not down, so no
// backoff); a failure to connect goes to the reconnection loop.
func (s *Source) restart(l *link) {
	defer close(l.guard.started)
	s.mu.Lock()
	if s.conn != l || s.closed {
		s.mu.Unlock()
		return
	}
	s.conn = nil
	s.mu.Unlock()
	l.c.Close()
	s.opts.Logger.Warn("upstream MCP server sent a message over the limit; restarting it",
		"server", s.opts.Name, "limit", s.opts.MaxMessage)
	if err := s.dial(context.Background()); err != nil {
		s.lost(err)
	}
	s.changed()
}

// overLimit turns a request that failed because a message went over the
// limit into capability_invalid_output, once the connection after l is up
// (so the next call finds it), or nil for any other failure.
func (s *Source) overLimit(ctx context.Context, l *link, what string, err error) error {
	switch {
	case l.guard.tripped():
		select {
		case <-l.guard.started:
		case <-ctx.Done():
		}
	case !asTooLarge(err):
		return nil
	}
	return s.tooLarge(what, err)
}

func (s *Source) newClient(g *guard, base *http.Header, modern bool) (*client.Client, error) {
	opts := []client.ClientOption{client.WithProtocolVersion(Protocol)}
	if modern {
		opts = []client.ClientOption{client.WithProtocolVersion(Modern)}
	}
	switch {
	case s.opts.Command != "":
		var extra []string
		for _, k := range slices.Sorted(maps.Keys(s.opts.Env)) {
			extra = append(extra, k+"="+s.opts.Env[k])
		}
		// An explicit environment: the allow list and the operator's
		// values, never capgate's own (mcp-go would append os.Environ()).
		env := proc.Env(s.opts.LookupEnv, nil, extra...)
		// The process lives as long as the source (see dial).
		stderr := new(proc.Tail)
		s.stderr.Store(stderr)
		t, err := startStdio(s.life, s.opts.Command, env, s.opts.Args, s.opts.Cwd, s.opts.MaxMessage, g, s.watch(s.opts.Confine), stderr)
		if err != nil {
			return nil, fmt.Errorf("mcp server %s: %w", s.opts.Name, err)
		}
		transport.WithCommandLogger(slog.New(warnOnly{s.opts.Logger.Handler()}))(t)
		return client.NewClient(t, opts...), nil
	case s.opts.Transport == "sse":
		t, err := transport.NewSSE(s.opts.URL, transport.WithHeaders(s.opts.Headers),
			transport.WithHTTPClient(&http.Client{Transport: &limitedTransport{next: pooledTransport, max: s.opts.MaxMessage}}))
		if err != nil {
			return nil, err
		}
		return client.NewClient(t, opts...), nil
	default:
		// The standalone GET stream carries what an upstream sends outside
		// a call's own stream: mcp-go servers send sampling requests there.
		t, err := transport.NewStreamableHTTP(s.opts.URL, transport.WithHTTPHeaders(s.opts.Headers),
			transport.WithHTTPHeaderFunc(headerFunc(base)),
			transport.WithHTTPBasicClient(&http.Client{Transport: &limitedTransport{next: pooledTransport, max: s.opts.MaxMessage}}),
			transport.WithHTTPLogger(slog.New(warnOnly{s.opts.Logger.Handler()})))
		if err != nil {
			return nil, err
		}
		if !modern {
			transport.WithContinuousListening()(t)
		}
		return client.NewClient(t, opts...), nil
	}
}

// notification routes progress to its call (by its token) and turns
// list_changed into a catalog refresh; what it cannot relate to a call it
// does not give to one.
func (s *Source) notification(l *link, n mcpgo.JSONRPCNotification) {
	switch n.Method {
	case "notifications/tools/list_changed":
		s.changed()
		return
	case string(mcpgo.MethodNotificationSubscriptionsAcknowledged):
		l.acked.Store(true)
		return
	case "notifications/progress":
		f := n.Params.AdditionalFields
		key := fmt.Sprint(f["progressToken"])
		if cb, ok := s.progress.Load(key); ok {
			p, _ := f["progress"].(float64)
			t, _ := f["total"].(float64)
			m, _ := f["message"].(string)
			cb.(func(float64, float64, string))(p, t, m)
		}
		return
	}
	params, err := json.Marshal(n.Params)
	if err != nil {
		return
	}
	if n.Method == "notifications/message" {
		// Outside a call's own stream only a caller's own session says
		// whose a log message is; on the shared one, given to a guessed
		// call it could reach another subject.
		if c := l.owners.latest(); c != nil && l.owned() && c.Log != nil {
			c.Log(params)
			return
		}
		s.opts.Logger.Debug("dropped an upstream log message that belongs to no call", "server", s.opts.Name)
		return
	}
	s.notify(n.Method, params)
}

func (s *Source) notify(method string, params json.RawMessage) {
	s.changeMu.Lock()
	fs := slices.Clone(s.onNotify)
	s.changeMu.Unlock()
	for _, f := range fs {
		f(method, params)
	}
}

// client returns the live connection or fails fast.
func (s *Source) client() (*link, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		// A restart capgate.lock's pins refused: the refusal, not an outage.
		var changed *sandbox.ChangedError
		if errors.As(s.lastErr, &changed) {
			return nil, changed.Refusal()
		}
		msg := fmt.Sprintf("mcp server %s is not connected", s.opts.Name)
		if s.lastErr != nil {
			msg += ": " + s.lastErr.Error()
		}
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "%s", msg)
	}
	return s.conn, nil
}

// drop forgets connection c after a transport failure and starts the
// reconnection loop.
func (s *Source) drop(l *link, err error) {
	if l.key != "" {
		s.dropKeyed(l)
		return
	}
	s.mu.Lock()
	if s.conn != l {
		s.mu.Unlock()
		return
	}
	s.conn = nil
	s.mu.Unlock()
	l.c.Close()
	s.opts.Logger.Warn("upstream MCP server lost; reconnecting", "server", s.opts.Name, "err", err)
	s.lost(err)
	s.changed()
}

// Retry has a disconnected source try to connect now rather than at its
// next backoff: when what it lacked may have arrived (the first user's
// sign-in to an upstream that lists its tools only to signed-in users).
func (s *Source) Retry() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// lost records err and runs one reconnection loop at a time.
func (s *Source) lost(err error) {
	s.mu.Lock()
	s.lastErr = err
	if s.retrying || s.closed {
		s.mu.Unlock()
		return
	}
	s.retrying = true
	s.mu.Unlock()
	go s.reconnect()
}

func (s *Source) reconnect() {
	wait := s.opts.MinBackoff
	defer func() {
		s.mu.Lock()
		s.retrying = false
		s.mu.Unlock()
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		case <-s.wake:
		}
		err := s.dial(context.Background())
		if err == nil {
			s.opts.Logger.Info("upstream MCP server reconnected", "server", s.opts.Name)
			s.changed()
			return
		}
		s.mu.Lock()
		s.lastErr = err
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		wait = min(wait*2, s.opts.MaxBackoff)
	}
}

// failed sorts a request error: a transport failure drops the connection
// and reads as backend unavailable; the upstream's own JSON-RPC error is
// passed on.
func (s *Source) failed(ctx context.Context, l *link, what string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) && ctx.Err() == nil {
		s.drop(l, err)
		return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: %s failed: the connection was lost", s.opts.Name, what)
	}
	if ctx.Err() != nil {
		return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: %s: %v", s.opts.Name, what, ctx.Err())
	}
	// mcp-go's error carries the upstream's own message.
	if err := harden.CheckMessage("mcp server "+s.opts.Name+": "+what, err.Error()); err != nil {
		return err
	}
	return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: %s: %v", s.opts.Name, what, err)
}

// rpcError is the error for an upstream's JSON-RPC error: its message,
// unless that holds a credential (then the error is withheld, cause and
// all); its data never reaches a caller, and is dropped when it holds one.
func (s *Source) rpcError(what string, code int, msg string, data any) error {
	if err := harden.CheckMessage("mcp server "+s.opts.Name+": "+what, msg); err != nil {
		return err
	}
	if data != nil {
		if b, err := json.Marshal(data); err != nil || harden.Found(b) {
			data = nil
		}
	}
	return tool.Wrap(&RPCError{Code: code, Message: msg, Data: data},
		tool.CodeBackendUnavailable, "mcp server %s: %s: %s", s.opts.Name, what, msg)
}

// rawTool is a tools/list entry as the upstream sent it.
type rawTool struct {
	Name         string           `json:"name"`
	Title        string           `json:"title"`
	Description  string           `json:"description"`
	InputSchema  json.RawMessage  `json:"inputSchema"`
	OutputSchema json.RawMessage  `json:"outputSchema"`
	Annotations  tool.Annotations `json:"annotations"`
}

// List reads tools/list raw, following every page.
func (s *Source) List(ctx context.Context) ([]*tool.Descriptor, error) {
	var out []*tool.Descriptor
	err := s.Pages(ctx, "tools/list", func(page json.RawMessage) (string, error) {
		var body struct {
			Tools      []rawTool `json:"tools"`
			NextCursor string    `json:"nextCursor"`
		}
		if err := json.Unmarshal(page, &body); err != nil {
			return "", err
		}
		for _, t := range body.Tools {
			out = append(out, s.descriptor(t))
		}
		return body.NextCursor, nil
	})
	if err != nil {
		return out, err
	}
	names := make(map[string]bool, len(out))
	heads := make(map[string]http.Header, len(out))
	for _, d := range out {
		names[d.Name] = true
		heads[d.Name] = toolsCallHeaders(d.Name)
	}
	s.listed.Store(&names)
	s.callHeads.Store(&heads)
	return out, nil
}

// Pages sends a list request (tools/list, resources/list, ...) and hands
// each page to f, which returns the next cursor, until there is none.
func (s *Source) Pages(ctx context.Context, method string, f func(json.RawMessage) (string, error)) error {
	cursor := ""
	for page := 0; ; page++ {
		if page > 1000 {
			return tool.Errorf(tool.CodeInvalidOutput, "mcp server %s: %s did not end after 1000 pages", s.opts.Name, method)
		}
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		res, err := s.Request(ctx, method, params)
		if err != nil {
			return err
		}
		next, err := f(res)
		if err != nil {
			return tool.Wrap(err, tool.CodeInvalidOutput, "mcp server %s: %s: %v", s.opts.Name, method, err)
		}
		if next == "" {
			return nil
		}
		cursor = next
	}
}

// RPCError is a JSON-RPC error the upstream answered with.
type RPCError struct {
	Code    int
	Message string
	Data    any
	// Status is the HTTP status the upstream answered with when it was
	// not 200 (a 4xx of the stateless protocol), else 0.
	Status int
}

func (e *RPCError) Error() string { return e.Message }

// Request sends one request to the upstream and returns its raw result:
// how lists, resources, prompts and completions are relayed. An error the
// upstream answered with is a *RPCError inside the tool error.
func (s *Source) Request(ctx context.Context, method string, params any) (json.RawMessage, error) {
	ctx, err := s.withHeaders(ctx, nil)
	if err != nil {
		return nil, err
	}
	l, err := s.linkFor(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	var header http.Header
	if l.modern() {
		p, err := modernParams(ctx, params)
		if err != nil {
			return nil, tool.Wrap(err, tool.CodeInternal, "mcp server %s: %s: %v", s.opts.Name, method, err)
		}
		params, header = p, standardHeaders(method, p)
	}
	send := func(ctx context.Context) (*transport.JSONRPCResponse, error) {
		return l.c.GetTransport().SendRequest(ctx, transport.JSONRPCRequest{
			JSONRPC: mcpgo.JSONRPC_VERSION,
			ID:      mcpgo.NewRequestId(fmt.Sprintf("capgate-%d", s.seq.Add(1))),
			Method:  method,
			Params:  params,
			Header:  header,
		})
	}
	resp, err := send(ctx)
	for again := false; errors.Is(err, transport.ErrAuthorizationRequired); again = true {
		// As for tools/call (postCall): the caller's token was refused, the
		// hook refreshes it once, and the second time says what to do.
		var ok bool
		var hookErr error
		if ctx, ok, hookErr = s.unauthorized(ctx, again); !ok {
			break
		}
		if hookErr != nil {
			return nil, hookErr
		}
		resp, err = send(ctx)
	}
	if err != nil {
		if e := s.overLimit(ctx, l, method, err); e != nil {
			return nil, e
		}
		return nil, s.failed(ctx, l, method, transport.NewError(err))
	}
	if resp.Error != nil {
		return nil, s.rpcError(method, resp.Error.Code, resp.Error.Message, resp.Error.Data)
	}
	return resp.Result, nil
}

func (s *Source) descriptor(t rawTool) *tool.Descriptor {
	a := t.Annotations
	var g *tool.Guarantees
	if s.opts.Command != "" { // a stdio server is a process capgate starts
		g = s.opts.Confine.Describe()
	}
	return &tool.Descriptor{
		ID:           tool.ID(tool.KindMCP, s.opts.Name, t.Name),
		Kind:         tool.KindMCP,
		Source:       s.opts.Name,
		Name:         t.Name,
		Title:        t.Title,
		Description:  t.Description,
		InputSchema:  t.InputSchema,
		OutputSchema: t.OutputSchema,
		Annotations:  a,
		Risk: risk.Assess(risk.Declaration{}, risk.Declaration{}, risk.Hints{
			Name: t.Name, Description: t.Description,
			ReadOnly: a.ReadOnlyHint, Destructive: a.DestructiveHint, OpenWorld: a.OpenWorldHint,
			TrustAnnotations: s.opts.TrustAnnotations,
		}),
		Available:  true,
		Guarantees: g,
		Launch:     s.launch,
	}
}

// Call calls the tool upstream, passing progress, log messages and the
// upstream's requests of the client through c, and cancellation (ctx)
// through to the upstream.
func (s *Source) Call(ctx context.Context, call tool.Call) (*tool.Result, error) {
	if call.Tool == nil || call.Tool.Kind != tool.KindMCP || call.Tool.Source != s.opts.Name {
		return nil, tool.Errorf(tool.CodeNotFound, "no such tool on mcp server %s", s.opts.Name)
	}
	if names := s.listed.Load(); names != nil && !(*names)[call.Tool.Name] {
		return nil, tool.Errorf(tool.CodeNotFound, "mcp server %s lists no tool %s", s.opts.Name, call.Tool.Name)
	}
	// The timeout bounds the whole call, opening the link included, as
	// CallTimeout promises the router. When the caller's deadline comes
	// first, a timer of the source's own would never fire over HTTP:
	// callHTTP leaves nothing running on ctx when it returns.
	own := !deadlineWithin(ctx, s.opts.Timeout)
	if own {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.Timeout)
		defer cancel()
	}
	if s.opts.Hooks.Headers != nil || s.opts.Hooks.SessionKey != nil {
		ctx = tool.WithSubject(ctx, call.Sub)
	}
	ctx, err := s.withHeaders(ctx, call.Ask)
	if err != nil {
		return nil, err
	}
	l, err := s.linkFor(ctx)
	if err != nil {
		return nil, err
	}
	defer l.owners.enter(&call)()
	args := call.Input
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if !own && !l.http {
		// The caller's deadline bounds it, but mcp-go's stdio and SSE
		// client leaves work running on ctx: it ends with the call.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	if l.http {
		return s.callHTTP(ctx, l, call, args)
	}
	if p := s.denied.Load(); p != nil && s.opts.Command != "" {
		// What its sandbox refuses the server during this call.
		c := p.enter(call.Denied)
		res, err := s.callMCPGo(ctx, l, call, args)
		return p.leave(c, res, err)
	}
	return s.callMCPGo(ctx, l, call, args)
}

// CallTimeout is the longest a Call runs (tool.Bounded): the server's
// timeout, after which the call ends with capability_backend_unavailable.
func (s *Source) CallTimeout() time.Duration { return s.opts.Timeout }

// deadlineWithin says whether ctx ends, at the latest, d from now.
func deadlineWithin(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) <= d
}

// callMCPGo calls through mcp-go's client: every stdio and SSE call, and
// the reference callHTTP is measured and checked against
// (BenchmarkCallHTTP, TestCallHTTPMatchesMCPGo).
func (s *Source) callMCPGo(ctx context.Context, l *link, call tool.Call, args json.RawMessage) (*tool.Result, error) {
	req := mcpgo.CallToolRequest{}
	req.Params.Name = call.Tool.Name
	req.Params.Arguments = args
	if call.Progress != nil {
		token := fmt.Sprintf("capgate-%s-%d", s.opts.Name, s.seq.Add(1))
		req.Params.Meta = &mcpgo.Meta{ProgressToken: token}
		s.progress.Store(token, call.Progress)
		defer s.progress.Delete(token)
	}
	traceMeta(ctx, &req.Params.Meta)
	res, err := l.c.CallTool(ctx, req)
	if err != nil {
		if e := s.overLimit(ctx, l, "tools/call "+call.Tool.Name, err); e != nil {
			return nil, e
		}
		return nil, s.failed(ctx, l, "tools/call "+call.Tool.Name, err)
	}
	return convertResult(res)
}

func convertResult(res *mcpgo.CallToolResult) (*tool.Result, error) {
	out := &tool.Result{IsError: res.IsError, Content: make([]json.RawMessage, 0, len(res.Content))}
	for _, c := range res.Content {
		b, err := json.Marshal(c)
		if err != nil {
			return nil, tool.Wrap(err, tool.CodeInvalidOutput, "content block: %v", err)
		}
		out.Content = append(out.Content, b)
	}
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, tool.Wrap(err, tool.CodeInvalidOutput, "structured content: %v", err)
		}
		out.Structured = b
	}
	return out, nil
}

// Close stops reconnecting and closes the connection (a stdio upstream's
// process ends with it).
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	defer s.end()
	l := s.conn
	s.conn = nil
	s.mu.Unlock()
	s.closeKeyed()
	if l != nil {
		return l.c.Close()
	}
	return nil
}

// warnOnly passes on warnings and errors only: mcp-go's transport logs
// routine events at info.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}
