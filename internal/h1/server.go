package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capgate/capgate/internal/rawconn"
)

// Request is one request the Server serves itself: its head parsed and
// its body read.
type Request struct {
	Method   string
	Path     string // as sent: the Server takes no path with escapes
	RawQuery string
	Host     string
	Body     []byte
	// LocalAddr is the address the request came in on.
	LocalAddr net.Addr
	base      context.Context // the connection's
	ctxMu     sync.Mutex
	ctx       context.Context // made from base on first use
	cancel    context.CancelFunc
	length    int64 // of the body, from Content-Length
	fields    []Field
	header    http.Header // made from fields on first use
}

// Get returns the first value of the header field key, or "", as
// http.Header's Get does.
func (r *Request) Get(key string) string {
	key = canonicalKey(key)
	for _, f := range r.fields {
		if f.Name == key {
			return f.Value
		}
	}
	return ""
}

// Fields are the request's header fields, in order; not to be changed.
func (r *Request) Fields() []Field { return r.fields }

// Header is the request's header fields as a map, made on first use:
// most requests the Server serves need only Get.
func (r *Request) Header() http.Header {
	if r.header == nil {
		r.header = header(r.fields)
	}
	return r.header
}

// Context ends when the request is done, its client goes away or the
// server shuts down.
func (r *Request) Context() context.Context {
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	if r.ctx == nil {
		r.ctx, r.cancel = context.WithCancel(r.base)
	}
	return r.ctx
}

// BaseContext is what Context derives from: it ends when the client goes
// away or the server shuts down, but not when the request is done. It
// serves work that is over before the handler returns, at no cost, where
// Context makes a context per request.
func (r *Request) BaseContext() context.Context { return r.base }

// done ends the request's context, if one was made.
func (r *Request) done() {
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
}

// Server owns HTTP/1.1 connections. Each request its Match takes is read
// and handed to Handler on the connection's own goroutine; a request it
// does not take, or one it cannot parse with confidence (chunked bodies,
// Expect, upgrades, HTTP/1.0, oversized heads), sends the connection,
// that request first, to Fallback, which keeps it.
type Server struct {
	Match    func(method, path string) bool
	Handler  func(w *ResponseWriter, r *Request)
	Fallback *http.Server
	// MaxBody bounds a request body the Server reads itself; a larger one
	// goes to Fallback. Default 8 MiB.
	MaxBody int64
	// IdleTimeout bounds the wait for a connection's next request, and
	// HeaderTimeout the read of a request once it has begun. Defaults 2
	// minutes and 10 seconds.
	IdleTimeout, HeaderTimeout time.Duration

	fallback chanListener
	mu       sync.Mutex
	conns    map[*conn]struct{}
	closing  atomic.Bool
	wg       sync.WaitGroup
	baseCtx  context.Context
	cancel   context.CancelFunc

	// The watcher (watchLoop): busy counts requests under way; idle is
	// set while the watcher waits on wake for one.
	busy        atomic.Int64
	watcherIdle atomic.Bool
	wake        chan struct{}
}

// Serve accepts connections on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	s.init()
	go s.Fallback.Serve(&s.fallback)
	for {
		c, err := l.Accept()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		cn := &conn{s: s, c: rawconn.Wrap(c)}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[cn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go cn.serve()
	}
}

func (s *Server) init() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns != nil {
		return
	}
	s.conns = map[*conn]struct{}{}
	s.fallback = chanListener{c: make(chan net.Conn), done: make(chan struct{})}
	s.baseCtx, s.cancel = context.WithCancel(context.Background())
	s.wake = make(chan struct{}, 1)
	s.watcherIdle.Store(true)
	go s.watchLoop()
	if s.MaxBody <= 0 {
		s.MaxBody = 8 << 20
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = 2 * time.Minute
	}
	if s.HeaderTimeout <= 0 {
		s.HeaderTimeout = 10 * time.Second
	}
}

// Shutdown stops taking connections, closes idle ones, waits for the
// requests under way to finish (until ctx ends, when it cancels them and
// closes their connections), and shuts Fallback down alike. The caller
// closes the listener.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	s.closing.Store(true)
	s.mu.Lock()
	for cn := range s.conns {
		cn.wakeIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	fberr := s.Fallback.Shutdown(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		for cn := range s.conns {
			cn.c.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
	s.cancel()
	return fberr
}

// chanListener hands connections to Fallback.
type chanListener struct {
	c    chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{} }

// conn is one client connection.
type conn struct {
	s  *Server
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	// ctx parents the connection's requests, so that their contexts
	// register with it and not all with the server's, under one lock. A
	// client that goes away cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	idle bool // waiting for the next request
	// The request under way and its watch (see watchLoop), under mu.
	reqStart time.Time
	wstate   int // watchDone, watchNone or watchOn
	wstopped chan struct{}
	wgone    bool
	// deadline is the read deadline now set; it is moved only when it
	// would pass too soon, to spare a timer update per request.
	deadline time.Time
}

func (cn *conn) serve() {
	defer cn.s.wg.Done()
	handed := false
	defer func() {
		cn.s.mu.Lock()
		delete(cn.s.conns, cn)
		cn.s.mu.Unlock()
		if !handed {
			cn.c.Close()
		}
	}()
	cn.ctx, cn.cancel = context.WithCancel(cn.s.baseCtx)
	defer cn.cancel()
	cn.br = bufio.NewReaderSize(cn.c, 16<<10)
	cn.bw = bufio.NewWriterSize(cn.c, 8<<10)
	for {
		if !cn.setIdle(true) {
			return
		}
		cn.readDeadline(cn.s.IdleTimeout)
		if _, err := cn.br.Peek(1); err != nil {
			return
		}
		if !cn.setIdle(false) {
			return
		}
		head, err := cn.readHead()
		if errors.Is(err, errHead) {
			handed = cn.handOff()
			return
		}
		if err != nil {
			return
		}
		req, n, ok := cn.parse(head)
		if !ok || !cn.s.Match(req.Method, req.Path) {
			handed = cn.handOff()
			return
		}
		cn.br.Discard(n)
		if req.Body, err = cn.readBody(req); err != nil {
			return
		}
		keep := cn.serveOne(req)
		if !keep || cn.s.closing.Load() {
			return
		}
	}
}

// setIdle marks the connection idle or busy; false when the server is
// closing and an idle connection should end.
func (cn *conn) setIdle(idle bool) bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	cn.idle = idle
	return !cn.s.closing.Load()
}

// wakeIfIdle ends the wait of an idle connection, for Shutdown.
func (cn *conn) wakeIfIdle() {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.idle {
		cn.c.SetReadDeadline(aLongTimeAgo)
	}
}

// readDeadline makes sure reads end within d from now, moving the
// deadline only when it would pass sooner than half of d from now.
func (cn *conn) readDeadline(d time.Duration) {
	now := time.Now()
	if want := now.Add(d); cn.deadline.Before(now.Add(d/2)) || cn.deadline.After(want) {
		cn.deadline = want
		cn.c.SetReadDeadline(want)
	}
}

// errHead is a head the Server will not parse itself.
var errHead = errors.New("h1: head left to net/http")

// readHead returns the buffered bytes of the next request's head, up to
// and including its blank line, without consuming them. A head too large
// for the buffer, or one with bare LF line ends, is errHead. A head that
// did not come whole in one read gets HeaderTimeout for the rest (the
// idle deadline is longer).
func (cn *conn) readHead() ([]byte, error) {
	return peekHead(cn.br, func() { cn.readDeadline(cn.s.HeaderTimeout) })
}

// peekHead returns the buffered bytes of the message head br starts with,
// up to and including its blank line, without consuming them; more runs
// before each read after the first. A head too large for the buffer, or
// one with bare LF line ends, is errHead.
func peekHead(br *bufio.Reader, more func()) ([]byte, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			if bytes.Contains(buf[:i], []byte("\n\n")) {
				return nil, errHead
			}
			return buf[:i+4], nil
		}
		if bytes.Contains(buf, []byte("\n\n")) || len(buf) == br.Size() {
			return nil, errHead
		}
		if more != nil {
			more()
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

// parse reads a head strictly: HTTP/1.1, an origin-form target without
// escapes, well-formed header fields, one Host, and a body framed by one
// Content-Length or none. Anything else is not ok and goes to net/http,
// which knows every corner of the protocol.
func (cn *conn) parse(head []byte) (*Request, int, bool) {
	n := len(head)
	h, ok := parseHead(head[:n-2])
	if !ok {
		return nil, 0, false
	}
	method, rest, ok1 := strings.Cut(h.first, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !isToken(method) ||
		len(target) == 0 || target[0] != '/' || strings.ContainsAny(target, "% \t#") {
		return nil, 0, false
	}
	path, query, _ := strings.Cut(target, "?")
	r := &Request{Method: method, Path: path, RawQuery: query, fields: h.fields, LocalAddr: cn.c.LocalAddr()}
	hosts, lengths := 0, 0
	for _, f := range h.fields {
		switch f.Name {
		case "Host":
			hosts++
			r.Host = f.Value
		case "Content-Length":
			lengths++
			length, ok := parseLength(f.Value)
			if !ok || length > cn.s.MaxBody {
				return nil, 0, false
			}
			r.length = length
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Trailer":
			return nil, 0, false
		}
	}
	if hosts != 1 || lengths > 1 {
		return nil, 0, false
	}
	return r, n, true
}

// head is a parsed message head: its first line and its header fields.
type head struct {
	first  string
	fields []Field
}

// Field is a header field, its name in canonical form.
type Field struct{ Name, Value string }

// header makes a map of fields, their values in one array.
func header(fields []Field) http.Header {
	h := make(http.Header, len(fields))
	values := make([]string, len(fields))
	for i, f := range fields {
		if vs, ok := h[f.Name]; ok {
			h[f.Name] = append(vs, f.Value)
		} else {
			values[i] = f.Value
			h[f.Name] = values[i : i+1 : i+1]
		}
	}
	return h
}

// parseHead splits a head, each line ending in CRLF, into its first line
// and header fields, which it checks: a token name, a colon, a value
// without control characters. Every string in it is a slice of one copy
// of the head, so a head costs three allocations, not a few per field.
func parseHead(b []byte) (head, bool) {
	s := string(b)
	first, s, _ := strings.Cut(s, "\r\n")
	h := head{first: first, fields: make([]Field, 0, strings.Count(s, "\r\n"))}
	for s != "" {
		var line string
		line, s, _ = strings.Cut(s, "\r\n")
		name, value, ok := strings.Cut(line, ":")
		if !ok || !isToken(name) {
			return head{}, false
		}
		value = strings.Trim(value, " \t")
		for j := 0; j < len(value); j++ {
			if c := value[j]; c < ' ' && c != '\t' || c == 0x7f {
				return head{}, false
			}
		}
		h.fields = append(h.fields, Field{canonicalKey(name), value})
	}
	return h, true
}

// canonicalKey is textproto's canonical form of a header name that is a
// token, without a copy when the name has it already.
func canonicalKey(name string) string {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return textproto.CanonicalMIMEHeaderKey(name)
		}
		upper = c == '-'
	}
	return name
}

// parseLength reads a Content-Length: decimal digits, at most 12.
func parseLength(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 12 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

// tokenChars are the bytes allowed in an RFC 9110 token.
var tokenChars = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

func isToken(s string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

func (cn *conn) readBody(r *Request) ([]byte, error) {
	if r.length == 0 {
		return nil, nil
	}
	b := make([]byte, r.length)
	_, err := io.ReadFull(cn.br, b)
	return b, err
}

// handOff gives the connection, with what has been read and not used, to
// Fallback.
func (cn *conn) handOff() bool {
	cn.c.SetReadDeadline(time.Time{})
	buffered, _ := cn.br.Peek(cn.br.Buffered())
	hc := &handedConn{Conn: cn.c, r: io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), cn.c)}
	select {
	case cn.s.fallback.c <- hc:
		return true
	case <-cn.s.fallback.done:
		return false
	}
}

// handedConn is a connection whose first bytes were already read.
type handedConn struct {
	net.Conn
	r io.Reader
}

func (h *handedConn) Read(p []byte) (int, error) { return h.r.Read(p) }

// CloseWrite lets net/http half-close the connection, as it does before
// closing one, so that the client reads the whole answer.
func (h *handedConn) CloseWrite() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serveOne runs the handler on req and finishes its response; it says
// whether the connection may carry another request.
func (cn *conn) serveOne(req *Request) bool {
	req.base = cn.ctx
	defer req.done()
	w := &ResponseWriter{bw: cn.bw, header: http.Header{}, c: cn.c, head: req.Method == http.MethodHead}
	w.close = cn.s.closing.Load()
	for _, f := range req.fields {
		if f.Name == "Connection" && hasToken([]string{f.Value}, "close") {
			w.close = true
		}
	}
	// A client that goes away mid-request cancels it; watched only for
	// requests that last, so that quick ones spare a goroutine.
	cn.startWatch(req.Method == http.MethodGet)
	panicked := func() (panicked bool) {
		defer func() {
			if v := recover(); v != nil {
				panicked = true
				w.abort = v == http.ErrAbortHandler
				if !w.abort {
					log.Printf("h1: panic serving %s %s: %v\n%s", req.Method, req.Path, v, debug.Stack())
				}
			}
		}()
		cn.s.Handler(w, req)
		return false
	}()
	if panicked {
		// Nothing the handler wrote may pass for a whole response: a 500
		// when nothing is on the wire yet (except for an abort), else the
		// connection is cut.
		cn.endWatch()
		if !w.committed && w.err == nil && !w.abort {
			w.reset()
			w.close = true
			w.header.Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "internal error\n")
			w.finish()
		}
		return false
	}
	peerGone := cn.endWatch()
	if cn.s.closing.Load() {
		w.close = true // say so, when the head is not out yet
	}
	if err := w.finish(); err != nil || peerGone {
		return false
	}
	return !w.close
}

// watchAfter is about how long a request runs before its connection is
// watched for the client going away.
const watchAfter = 5 * time.Millisecond

// A request is watched for its client closing the connection, which
// cancels it. One goroutine per server (watchLoop) starts the watches of
// requests that have run for watchAfter, so that a quick request costs no
// timer, no goroutine and no allocation; a GET, which may stream for long,
// is watched at once.
const (
	watchDone = iota // no request under way
	watchNone        // a request under way, not watched (yet)
	watchOn          // a request under way, watched
)

// startWatch marks a request under way, watched at once when now.
func (cn *conn) startWatch(now bool) {
	if _, ok := cn.c.(*rawconn.Conn); !ok {
		cn.mu.Lock()
		cn.wstate = watchDone
		cn.mu.Unlock()
		return
	}
	cn.mu.Lock()
	cn.reqStart, cn.wstate, cn.wgone = time.Now(), watchNone, false
	if now {
		cn.beginWatch()
	}
	cn.mu.Unlock()
	s := cn.s
	s.busy.Add(1)
	if !now && s.watcherIdle.CompareAndSwap(true, false) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// endWatch ends the request's watch and says whether the client went away.
func (cn *conn) endWatch() bool {
	cn.mu.Lock()
	st := cn.wstate
	cn.wstate = watchDone
	if st == watchOn {
		cn.c.SetReadDeadline(aLongTimeAgo)
	}
	cn.mu.Unlock()
	if st == watchDone {
		return false
	}
	cn.s.busy.Add(-1)
	if st != watchOn {
		return false
	}
	<-cn.wstopped
	cn.c.SetReadDeadline(time.Time{})
	cn.deadline = time.Time{}
	return cn.wgone
}

// beginWatch starts watching; the caller holds cn.mu.
func (cn *conn) beginWatch() {
	cn.wstate = watchOn
	// The head's deadline must not end a long request's watch.
	cn.c.SetReadDeadline(time.Time{})
	stopped, cancel := make(chan struct{}), cn.cancel
	cn.wstopped = stopped
	rc := cn.c.(*rawconn.Conn)
	go func() {
		defer close(stopped)
		closed, _, err := rc.Peek(true)
		if err == nil && closed {
			cn.wgone = true // read by endWatch after stopped closes
			cancel()
		}
	}()
}

// watchLoop starts the watches of requests that have run for watchAfter;
// it sleeps while no request is under way.
func (s *Server) watchLoop() {
	for {
		select {
		case <-s.wake:
		case <-s.baseCtx.Done():
			return
		}
		for {
			time.Sleep(watchAfter)
			if s.busy.Load() == 0 {
				s.watcherIdle.Store(true)
				// A request that began before the flag was up did not
				// wake the watcher; it must not go unwatched.
				if s.busy.Load() == 0 || !s.watcherIdle.CompareAndSwap(true, false) {
					break
				}
			}
			now := time.Now()
			s.mu.Lock()
			for cn := range s.conns {
				cn.mu.Lock()
				if cn.wstate == watchNone && now.Sub(cn.reqStart) >= watchAfter {
					cn.beginWatch()
				}
				cn.mu.Unlock()
			}
			s.mu.Unlock()
		}
	}
}

func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
