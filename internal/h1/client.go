// Package h1 is a lean HTTP/1.1 for capgate's hot path: a client
// transport that does a whole exchange on the caller's goroutine, and a
// server loop that serves the requests it is given and passes every
// other connection, whole, to net/http.
//
// net/http spends a goroutine hand-off or two on every request (the
// transport's read and write loops, the server's background read), and on
// a machine with few cores each hand-off can cost a thread wake-up, which
// costs more than the request. Here the goroutine that has the request
// writes it, waits in the netpoller and reads the answer itself.
package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/internal/rawconn"
)

// Transport is an http.RoundTripper for plain-HTTP/1.1 upstreams with a
// pool of kept-alive connections. Requests it does not take (https, a
// proxy from the environment, an upgrade) go to Fallback.
type Transport struct {
	Fallback       http.RoundTripper
	MaxIdlePerHost int           // default 128
	IdleTimeout    time.Duration // default 90s

	dialer net.Dialer
	mu     sync.Mutex
	idle   map[string][]*pconn
	direct map[string]bool // host:port → no proxy applies
}

type pconn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	key  string
	used time.Time
}

// aLongTimeAgo is a deadline that has passed: it interrupts a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip sends req and reads the response head; the body is read on
// the caller's goroutine too, and the connection goes back to the pool
// when the body has been read to its end.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, ok := t.takes(req)
	if !ok {
		return t.Fallback.RoundTrip(req)
	}
	ctx := req.Context()
	bp := requestBufs.Get().(*[]byte)
	defer requestBufs.Put(bp)
	wire, lean, err := appendRequest((*bp)[:0], req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if lean {
		*bp = wire
		closeBody(req)
	}
	for {
		pc, reused, err := t.get(ctx, key, !lean)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.exchange(ctx, pc, req, wire, lean)
		// A reused connection the server had closed got nothing: the
		// request goes on another one.
		if errors.Is(err, rawconn.ErrNotSent) && reused && ctx.Err() == nil {
			continue
		}
		return resp, err
	}
}

// exchange writes req on pc (wire when lean, else req.Write) and reads
// the answer's head.
func (t *Transport) exchange(ctx context.Context, pc *pconn, req *http.Request, wire []byte, lean bool) (*http.Response, error) {
	stop := func() bool { return true }
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { pc.c.SetDeadline(aLongTimeAgo) })
	}
	fail := func(err error) (*http.Response, error) {
		stop()
		pc.c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	rc, raw := pc.c.(*rawconn.Conn)
	switch {
	case lean && raw:
		rc.WriteBeforeRead(wire)
	case lean:
		if _, err := pc.c.Write(wire); err != nil {
			return fail(err)
		}
	default:
		if err := req.Write(pc.bw); err != nil {
			return fail(err)
		}
		if err := pc.bw.Flush(); err != nil {
			return fail(err)
		}
	}
	resp, err := readResponse(pc.br, req)
	// Informational answers (100 Continue, 103 Early Hints) come before
	// the real one, as net/http's transport skips them.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = readResponse(pc.br, req)
	}
	if err != nil {
		return fail(err)
	}
	reusable := !resp.Close && (resp.ContentLength >= 0 || isChunked(resp))
	b := &body{rc: resp.Body, pc: pc, t: t, stop: stop, reusable: reusable}
	if resp.Body == http.NoBody {
		b.release(true)
	} else {
		resp.Body = b
	}
	return resp, nil
}

// requestBufs hold lean requests on their way out.
var requestBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// maxLeanBody is the largest request body appendRequest copies.
const maxLeanBody = 64 << 10

// appendRequest appends req as req.Write would write it, when req is
// plain: a body of known length up to maxLeanBody (read here, whole), no
// trailers, no transfer coding, a plain ASCII host. lean is false, and
// nothing is read, when req is not; it then goes out through req.Write.
// Header fields go in map order rather than sorted.
func appendRequest(b []byte, req *http.Request) (out []byte, lean bool, err error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	body := req.Body != nil && req.Body != http.NoBody
	uri := req.URL.RequestURI()
	if req.Method == http.MethodConnect || !isToken(req.Method) || !plainHost(host) || !plainTarget(uri) ||
		len(req.Trailer) > 0 || len(req.TransferEncoding) > 0 ||
		body && (req.ContentLength <= 0 || req.ContentLength > maxLeanBody) || !body && req.ContentLength != 0 {
		return b, false, nil
	}
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	ua := "Go-http-client/1.1"
	if v, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(v) > 0 {
			ua = v[0]
		}
	}
	if ua != "" {
		b = append(b, "User-Agent: "...)
		b = append(b, fieldValue(ua)...)
		b = append(b, "\r\n"...)
	}
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		body = true // as net/http, a Content-Length even of 0
	}
	if body {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, max(req.ContentLength, 0), 10)
		b = append(b, "\r\n"...)
	}
	for k, vs := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if !isToken(k) {
			continue // dropped, as net/http does
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, fieldValue(v)...)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "\r\n"...)
	if req.ContentLength == 0 {
		return b, true, nil
	}
	n := len(b)
	b = slices.Grow(b, int(req.ContentLength))[:n+int(req.ContentLength)]
	if _, err := io.ReadFull(req.Body, b[n:]); err != nil {
		return b, false, fmt.Errorf("http: ContentLength=%d with a shorter body: %w", req.ContentLength, err)
	}
	var one [1]byte
	if k, _ := req.Body.Read(one[:]); k > 0 {
		return b, false, fmt.Errorf("http: ContentLength=%d with a longer body", req.ContentLength)
	}
	return b, true, nil
}

// plainTarget is a request target without control characters, which
// req.Write refuses.
func plainTarget(uri string) bool {
	for i := 0; i < len(uri); i++ {
		if uri[i] < ' ' || uri[i] == 0x7f {
			return false
		}
	}
	return uri != ""
}

// plainHost is a host[:port] of letters, digits, dots, hyphens, colons and
// brackets: nothing to encode, nothing to check.
func plainHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		switch c := h[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return true
}

// fieldValue is v as net/http writes a field value: CR and LF become
// spaces, and surrounding spaces and tabs go.
func fieldValue(v string) string {
	return strings.Trim(headerValue(v), " \t")
}

// readResponse reads an answer's head. A plain one (HTTP/1.1, a body of
// one Content-Length) is parsed here; anything else, from the same
// bytes, by net/http's ReadResponse, which knows every corner of the
// protocol.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // as ReadResponse has it
		}
		return nil, err
	}
	head, err := peekHead(br, nil)
	if errors.Is(err, errHead) {
		return http.ReadResponse(br, req)
	}
	if err != nil {
		return nil, err
	}
	resp, ok := parseResponse(head, br, req)
	if !ok {
		return http.ReadResponse(br, req)
	}
	br.Discard(len(head))
	return resp, nil
}

// parseResponse parses a plain answer's head, which br starts with.
func parseResponse(head []byte, br *bufio.Reader, req *http.Request) (*http.Response, bool) {
	if req.Method == http.MethodHead {
		return nil, false
	}
	h, ok := parseHead(head[:len(head)-2])
	if !ok {
		return nil, false
	}
	hdr := header(h.fields)
	status, ok := strings.CutPrefix(h.first, "HTTP/1.1 ")
	if !ok || len(status) < 3 || len(status) > 3 && status[3] != ' ' {
		return nil, false
	}
	code, ok := parseLength(status[:3])
	cl := hdr["Content-Length"]
	if !ok || code < 200 || code == http.StatusNoContent || code == http.StatusNotModified || len(cl) != 1 {
		return nil, false
	}
	if _, ok := hdr["Transfer-Encoding"]; ok {
		return nil, false
	}
	if _, ok := hdr["Pragma"]; ok {
		return nil, false // ReadResponse adds a Cache-Control to it
	}
	n, ok := parseLength(cl[0])
	if !ok {
		return nil, false
	}
	resp := &http.Response{Status: status, StatusCode: int(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr, ContentLength: n, Request: req}
	if hasToken(hdr["Connection"], "close") {
		resp.Close = true
		delete(hdr, "Connection") // as ReadResponse does
	}
	resp.Body = http.NoBody
	if n > 0 {
		resp.Body = &lengthBody{br: br, n: n}
	}
	return resp, true
}

// lengthBody is a body of Content-Length n.
type lengthBody struct {
	br *bufio.Reader
	n  int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	k, err := b.br.Read(p)
	b.n -= int64(k)
	switch {
	case b.n == 0:
		return k, io.EOF
	case err == io.EOF:
		return k, io.ErrUnexpectedEOF
	}
	return k, err
}

func (b *lengthBody) Close() error { return nil }

// takes says whether t does req itself, and the pool key if it does.
func (t *Transport) takes(req *http.Request) (string, bool) {
	if req.URL.Scheme != "http" || req.Header.Get("Upgrade") != "" || req.Close {
		return "", false
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	t.mu.Lock()
	direct, known := t.direct[host]
	t.mu.Unlock()
	if !known {
		proxy, err := http.ProxyFromEnvironment(&http.Request{URL: &url.URL{Scheme: "http", Host: host}})
		direct = err == nil && proxy == nil
		t.mu.Lock()
		if t.direct == nil {
			t.direct = map[string]bool{}
		}
		t.direct[host] = direct
		t.mu.Unlock()
	}
	return host, direct
}

// get takes an idle connection to key, or dials one; reused says which.
// An idle connection with bytes waiting is not taken; with check, nor is
// one the server has closed. Without, the exchange finds that out (see
// rawconn.WriteBeforeRead) at no extra cost.
func (t *Transport) get(ctx context.Context, key string, check bool) (pc *pconn, reused bool, err error) {
	timeout := t.IdleTimeout
	if timeout <= 0 {
		timeout = 90 * time.Second
	}
	now := time.Now()
	for {
		t.mu.Lock()
		list := t.idle[key]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		pc := list[len(list)-1]
		t.idle[key] = list[:len(list)-1]
		t.mu.Unlock()
		if now.Sub(pc.used) < timeout && pc.br.Buffered() == 0 && (!check || open(pc)) {
			return pc, true, nil
		}
		pc.c.Close()
	}
	c, err := t.dialer.DialContext(ctx, "tcp", key)
	if err != nil {
		return nil, false, err
	}
	c = rawconn.Wrap(c)
	return &pconn{c: c, br: bufio.NewReaderSize(c, 8<<10), bw: bufio.NewWriterSize(c, 8<<10), key: key}, false, nil
}

// open says whether an idle connection can carry a request: the server
// has not closed it (nor sent anything unasked).
func open(pc *pconn) bool {
	rc, ok := pc.c.(*rawconn.Conn)
	if !ok {
		return true
	}
	closed, data, err := rc.Peek(false)
	return err == nil && !closed && !data
}

// put returns pc to the pool.
func (t *Transport) put(pc *pconn) {
	max := t.MaxIdlePerHost
	if max <= 0 {
		max = 128
	}
	pc.used = time.Now()
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[string][]*pconn{}
	}
	if len(t.idle[pc.key]) < max {
		t.idle[pc.key] = append(t.idle[pc.key], pc)
		pc = nil
	}
	t.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// CloseIdleConnections closes the pooled connections.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.c.Close()
		}
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// body is a response body that gives its connection back when read to
// the end, and closes it when abandoned before. As with net/http, Close
// may come from another goroutine while a Read waits: it closes the
// connection, which ends the Read.
type body struct {
	rc       io.ReadCloser
	pc       *pconn
	t        *Transport
	stop     func() bool
	reusable bool

	mu   sync.Mutex
	done bool
}

var errClosedBody = errors.New("h1: read on a closed response body")

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	if done {
		return 0, errClosedBody
	}
	n, err := b.rc.Read(p)
	if err != nil {
		b.mu.Lock()
		if !b.done {
			b.done = true
			b.release(errors.Is(err, io.EOF))
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.done = true
		b.release(false)
	}
	return nil
}

// release gives the connection back to the pool when the body was read to
// its end on a connection fit for another request, and closes it
// otherwise.
func (b *body) release(atEOF bool) {
	// stop is false when the request's context ended and the deadline
	// was already cut short.
	if b.stop() && atEOF && b.reusable {
		b.t.put(b.pc)
		return
	}
	b.pc.c.Close()
}

func isChunked(resp *http.Response) bool {
	for _, te := range resp.TransferEncoding {
		if strings.EqualFold(te, "chunked") {
			return true
		}
	}
	return false
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
