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
	"io"
	"net"
	"net/http"
	"net/url"
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
	pc, err := t.get(ctx, key)
	if err != nil {
		closeBody(req)
		return nil, err
	}
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
	if err := req.Write(pc.bw); err != nil {
		return fail(err)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(pc.br, req)
	// Informational answers (100 Continue, 103 Early Hints) come before
	// the real one, as net/http's transport skips them.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(pc.br, req)
	}
	if err != nil {
		return fail(err)
	}
	reusable := !resp.Close && (resp.ContentLength >= 0 || isChunked(resp))
	resp.Body = &body{rc: resp.Body, pc: pc, t: t, stop: stop, reusable: reusable}
	return resp, nil
}

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

// get takes an idle connection to key that is still open, or dials one.
func (t *Transport) get(ctx context.Context, key string) (*pconn, error) {
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
		if now.Sub(pc.used) < timeout && open(pc) {
			return pc, nil
		}
		pc.c.Close()
	}
	c, err := t.dialer.DialContext(ctx, "tcp", key)
	if err != nil {
		return nil, err
	}
	c = rawconn.Wrap(c)
	return &pconn{c: c, br: bufio.NewReaderSize(c, 8<<10), bw: bufio.NewWriterSize(c, 8<<10), key: key}, nil
}

// open says whether an idle connection can carry a request: the server
// has not closed it (nor sent anything unasked).
func open(pc *pconn) bool {
	if pc.br.Buffered() > 0 {
		return false
	}
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
