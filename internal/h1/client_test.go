package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upstream is a net/http server on loopback that counts its connections.
type upstream struct {
	URL            string
	opened, closed atomic.Int32
}

func newUpstream(t *testing.T, h http.HandlerFunc, opts ...func(*http.Server)) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{URL: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.closed.Add(1)
		}
	}}
	for _, o := range opts {
		o(srv)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

// eventually polls cond for up to 5 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// rtFunc is a stub RoundTripper, used as the Fallback seam.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newClient returns a client on a fresh Transport whose Fallback fails the test.
func newClient(t *testing.T) (*http.Client, *Transport) {
	tr := &Transport{Fallback: rtFunc(func(r *http.Request) (*http.Response, error) {
		t.Errorf("unexpected fallback for %s", r.URL)
		return nil, errors.New("no fallback")
	})}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, tr
}

func fetch(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return string(b)
}

// The point of the pool: sequential calls share one TCP connection.
func TestTransportReusesOneConnection(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) })
	c, _ := newClient(t)
	for i := range 20 {
		if got, want := fetch(t, c, fmt.Sprintf("%s/n%d", u.URL, i)), fmt.Sprintf("/n%d", i); got != want {
			t.Fatalf("body %q, want %q", got, want)
		}
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("%d connections for 20 sequential requests, want 1", n)
	}
}

// Streamed (chunked) upstream replies must arrive whole and keep the conn reusable.
func TestTransportChunkedBodyReadWholeAndReused(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		for _, part := range []string{"alpha,", "beta,", "gamma"} {
			io.WriteString(w, part)
			w.(http.Flusher).Flush()
		}
	})
	c, _ := newClient(t)
	for range 3 {
		resp, err := c.Get(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "alpha,beta,gamma" {
			t.Fatalf("body %q, %v", b, err)
		}
		if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
			t.Fatalf("TransferEncoding %v, want chunked", resp.TransferEncoding)
		}
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// rawUpstream serves every request on a connection with respond's bytes,
// whatever they say, so the client's own reuse decision is what is tested.
func rawUpstream(t *testing.T, respond func(*http.Request) string) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opened atomic.Int32
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			opened.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, respond(req)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), &opened
}

// A response saying Connection: close must retire its conn even if the server leaves it open.
func TestTransportConnectionCloseNotReused(t *testing.T) {
	url, opened := rawUpstream(t, func(*http.Request) string {
		return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
	})
	c, _ := newClient(t)
	for range 3 {
		if got := fetch(t, c, url); got != "ok" {
			t.Fatalf("body %q", got)
		}
	}
	if n := opened.Load(); n != 3 {
		t.Fatalf("%d connections for 3 Connection: close responses, want 3", n)
	}
}

// A pooled conn the server has since closed must not fail the next call.
func TestTransportRedialsAfterServerClosesIdleConn(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") },
		func(s *http.Server) { s.IdleTimeout = 20 * time.Millisecond })
	c, _ := newClient(t)
	fetch(t, c, u.URL)
	eventually(t, "the server to close the idle conn", func() bool { return u.closed.Load() == 1 })
	if got := fetch(t, c, u.URL); got != "ok" {
		t.Fatalf("body %q", got)
	}
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// Conns idle longer than the Transport's IdleTimeout are dropped, not reused.
func TestTransportIdleTimeoutDropsConn(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	c, tr := newClient(t)
	tr.IdleTimeout = 30 * time.Millisecond
	fetch(t, c, u.URL)
	time.Sleep(40 * time.Millisecond) // just past IdleTimeout
	fetch(t, c, u.URL)
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	eventually(t, "the stale conn to be closed", func() bool { return u.closed.Load() == 1 })
}

// A cancelled call must return at once, and its half-used conn must not be pooled.
func TestTransportCancelWhileServerBlocks(t *testing.T) {
	entered := make(chan struct{}, 1)
	serverSawClose := make(chan struct{}, 1)
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/block" {
			io.WriteString(w, "ok")
			return
		}
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			serverSawClose <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	})
	c, _ := newClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-entered; cancel() }()
	req, _ := http.NewRequestWithContext(ctx, "GET", u.URL+"/block", nil)
	start := time.Now()
	_, err := c.Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancelled call took %v", d)
	}
	select {
	case <-serverSawClose:
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled call's conn was not closed")
	}
	fetch(t, c, u.URL)
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (cancelled conn reused?)", n)
	}
}

// https, upgrades and Close requests are net/http's job.
func TestTransportHandsOtherRequestsToFallback(t *testing.T) {
	var got []*http.Request
	tr := &Transport{Fallback: rtFunc(func(r *http.Request) (*http.Response, error) {
		got = append(got, r)
		return &http.Response{StatusCode: 299, Body: http.NoBody, Request: r}, nil
	})}
	upgrade, _ := http.NewRequest("GET", "http://127.0.0.1:1/ws", nil)
	upgrade.Header.Set("Upgrade", "websocket")
	closing, _ := http.NewRequest("GET", "http://127.0.0.1:1/", nil)
	closing.Close = true
	https, _ := http.NewRequest("GET", "https://example.invalid/x", nil)
	for _, req := range []*http.Request{https, upgrade, closing} {
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 299 {
			t.Fatalf("%s: resp %v, err %v; want the Fallback's", req.URL, resp, err)
		}
		if got[len(got)-1] != req {
			t.Fatalf("%s: Fallback got another request", req.URL)
		}
	}
}

// An abandoned body leaves unread bytes on the conn; reusing it would corrupt the next reply.
func TestTransportEarlyBodyCloseDiscardsConn(t *testing.T) {
	big := strings.Repeat("x", 256<<10)
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) })
	c, _ := newClient(t)
	resp, err := c.Get(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(resp.Body, make([]byte, 100))
	resp.Body.Close()
	eventually(t, "the abandoned conn to close", func() bool { return u.closed.Load() == 1 })
	if got := fetch(t, c, u.URL); got != big {
		t.Fatalf("second body has %d bytes, want %d", len(got), len(big))
	}
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// Callers (mcp-go's GET stream) close a body from another goroutine to end a waiting Read.
func TestTransportBodyCloseEndsWaitingRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "event;")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	c, _ := newClient(t)
	resp, err := c.Get(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(resp.Body, make([]byte, 6))
	readErr := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 10))
		readErr <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the Read block
	resp.Body.Close()
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("Read on a closed body returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the waiting Read")
	}
	eventually(t, "the conn to close", func() bool { return u.closed.Load() == 1 })
}

// Under concurrency each conn carries one call at a time, and the pool bounds dialing.
func TestTransportConcurrentRequests(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) })
	c, _ := newClient(t)
	const workers, each = 16, 50
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for g := range workers {
		wg.Go(func() {
			for i := range each {
				want := fmt.Sprintf("g%d-i%d", g, i)
				resp, err := c.Post(u.URL, "text/plain", strings.NewReader(want))
				if err != nil {
					errc <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != want {
					errc <- fmt.Errorf("body %q, %v; want %q", b, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if n := u.opened.Load(); n > workers {
		t.Fatalf("%d connections for %d workers", n, workers)
	}
}

// The pool keeps at most MaxIdlePerHost conns and closes the rest.
func TestTransportMaxIdlePerHost(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	c, tr := newClient(t)
	tr.MaxIdlePerHost = 1
	var open []*http.Response
	for range 3 { // bodies held open: each call dials
		resp, err := c.Get(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, resp)
	}
	for _, resp := range open {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	eventually(t, "two surplus conns to close", func() bool { return u.closed.Load() == 2 })
	fetch(t, c, u.URL)
	if n := u.opened.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (the kept one reused)", n)
	}
}

// CloseIdleConnections empties the pool and passes on to the Fallback.
func TestTransportCloseIdleConnections(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	fb := &closeRecorder{}
	tr := &Transport{Fallback: fb}
	c := &http.Client{Transport: tr}
	fetch(t, c, u.URL)
	tr.CloseIdleConnections()
	if !fb.called.Load() {
		t.Error("Fallback's CloseIdleConnections not called")
	}
	eventually(t, "the pooled conn to close", func() bool { return u.closed.Load() == 1 })
	fetch(t, c, u.URL)
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	tr.CloseIdleConnections()
}

type closeRecorder struct{ called atomic.Bool }

func (*closeRecorder) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("unexpected")
}
func (c *closeRecorder) CloseIdleConnections() { c.called.Store(true) }

type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

// RoundTripper contract: the request body is closed even when the call fails.
func TestTransportDialErrorClosesRequestBody(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, tr := newClient(t)
	body := &trackedBody{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest("POST", "http://"+addr+"/", body)
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("RoundTrip to a closed port succeeded")
	}
	if !body.closed.Load() {
		t.Fatal("request body left open after a dial error")
	}
}

// A RoundTripper must return the final response, not an informational 1xx one.
func TestTransportSkipsInformationalResponses(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	})
	c, _ := newClient(t)
	resp, err := c.Get(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Equal(b, []byte("final")) {
		t.Fatalf("got %d %q; want 200 \"final\"", resp.StatusCode, b)
	}
}
