package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// startServer runs a Server on loopback that serves /fast with h and
// hands the rest to a net/http Fallback that echoes method, path and body
// ("/noread" answers without reading the body).
func startServer(t *testing.T, h func(w *ResponseWriter, r *Request), opts ...func(*Server)) (string, *Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{
		Match:   func(m, p string) bool { return p == "/fast" },
		Handler: h,
		Fallback: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/noread" {
				io.WriteString(w, "early")
				return
			}
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "fallback %s %s %s", r.Method, r.URL.Path, b)
		})},
	}
	for _, o := range opts {
		o(s)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), s
}

// echoFast answers with the request's method, path and body.
func echoFast(w *ResponseWriter, r *Request) {
	fmt.Fprintf(w, "fast %s %s %s", r.Method, r.Path, r.Body)
}

// rawClient speaks HTTP/1.1 by hand on one TCP connection.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawClient) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// try reads one response to a request of method, body included.
func (rc *rawClient) try(method string) (*http.Response, string, error) {
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func (rc *rawClient) recv(method string) (*http.Response, string) {
	rc.t.Helper()
	resp, body, err := rc.try(method)
	if err != nil {
		rc.t.Fatalf("reading response: %v", err)
	}
	return resp, body
}

// expectClosed fails unless the server closes the connection soon.
func (rc *rawClient) expectClosed() {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := rc.br.ReadByte()
	var ne net.Error
	switch {
	case err == nil:
		rc.t.Fatalf("got byte %q, want the connection closed", b)
	case errors.As(err, &ne) && ne.Timeout():
		rc.t.Fatal("connection still open")
	}
}

func get(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }

func post(path, body string, extra ...string) string {
	h := ""
	for _, e := range extra {
		h += e + "\r\n"
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", path, h, len(body), body)
}

// The fast path's whole point: many keep-alive requests, each framed by Content-Length.
func TestServerKeepAliveRequestsGetContentLength(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	for i := range 5 {
		body := fmt.Sprintf("req%d", i)
		rc.send(post("/fast", body))
		resp, got := rc.recv("POST")
		if want := "fast POST /fast " + body; got != want {
			t.Fatalf("body %q, want %q", got, want)
		}
		if resp.ContentLength != int64(len(got)) || resp.TransferEncoding != nil || resp.Close {
			t.Fatalf("framing: CL %d TE %v Close %v", resp.ContentLength, resp.TransferEncoding, resp.Close)
		}
	}
}

// Handlers see the request as sent.
func TestServerRequestFields(t *testing.T) {
	got := make(chan *Request, 1)
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) { got <- r })
	rc := dialRaw(t, addr)
	rc.send("GET /fast?a=1&b=2 HTTP/1.1\r\nHost: example.com\r\nX-Test:  v1 \r\n\r\n")
	rc.recv("GET")
	r := <-got
	if r.Method != "GET" || r.Path != "/fast" || r.RawQuery != "a=1&b=2" || r.Host != "example.com" ||
		r.Get("X-Test") != "v1" || r.Get("x-test") != "v1" || r.Get("X-TEST") != "v1" || r.LocalAddr.String() != addr {
		t.Fatalf("request %+v", r)
	}
}

// Streaming (SSE) needs Flush to put data on the wire before the handler returns.
func TestServerFlushStreamsChunked(t *testing.T) {
	proceed := make(chan struct{})
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		io.WriteString(w, "first;")
		w.Flush()
		select {
		case <-proceed:
			io.WriteString(w, "second")
		case <-time.After(5 * time.Second): // the client never saw "first;"
			io.WriteString(w, "timed out")
		}
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("TransferEncoding %v, want chunked", resp.TransferEncoding)
	}
	first := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first;" {
		t.Fatalf("before handler resumed: %q, %v", first, err)
	}
	close(proceed)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "second" {
		t.Fatalf("after Flush: %q, %v", rest, err)
	}
}

// A body larger than the buffer switches to chunked without losing bytes.
func TestServerLargeUnflushedBodyGoesChunked(t *testing.T) {
	big := strings.Repeat("0123456789", 4<<10) // 40 KiB > bufferMax
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		for i := 0; i < len(big); i += 1000 {
			io.WriteString(w, big[i:min(i+1000, len(big))])
		}
	})
	rc := dialRaw(t, addr)
	for range 2 { // and the connection stays in step
		rc.send(get("/fast"))
		resp, body := rc.recv("GET")
		if body != big || resp.ContentLength != -1 {
			t.Fatalf("got %d bytes (CL %d), want %d chunked", len(body), resp.ContentLength, len(big))
		}
	}
}

// A connection changes hands mid-stream: the fallback must get the request's bytes intact and keep the conn.
func TestServerOtherPathOnSameConnGoesToFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	if _, body := rc.recv("GET"); body != "fast GET /fast " {
		t.Fatalf("fast: %q", body)
	}
	rc.send(post("/other", "payload"))
	if _, body := rc.recv("POST"); body != "fallback POST /other payload" {
		t.Fatalf("handed: %q", body)
	}
	rc.send(post("/fast", "again")) // the fallback owns the conn now
	if _, body := rc.recv("POST"); body != "fallback POST /fast again" {
		t.Fatalf("after hand-off: %q", body)
	}
}

// Chunked request bodies are net/http's to decode.
func TestServerChunkedRequestGoesToFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	rc.send("POST /fast HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n")
	if _, body := rc.recv("POST"); body != "fallback POST /fast hello world" {
		t.Fatalf("body %q", body)
	}
}

// Garbage must get net/http's standard answer, not a silent close.
func TestServerMalformedRequestGets400FromFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	rc.send("BROKEN\r\n\r\n")
	if resp, body := rc.recv("GET"); resp.StatusCode != 400 {
		t.Fatalf("status %d %q, want 400", resp.StatusCode, body)
	}
}

// Pipelined requests share a read buffer; each must be answered, in order, even across a hand-off.
func TestServerPipelinedRequestsAnsweredInOrder(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	rc.send(post("/fast", "one") + get("/fast") + post("/other", "three"))
	for _, want := range []string{"fast POST /fast one", "fast GET /fast ", "fallback POST /other three"} {
		if _, body := rc.recv(""); body != want {
			t.Fatalf("body %q, want %q", body, want)
		}
	}
}

// Heads the strict parser will not take go to net/http rather than being dropped.
func TestServerHandsUnparsedHeadsToFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	for name, req := range map[string]string{
		"http1.0":      "GET /fast HTTP/1.0\r\n\r\n",
		"escaped path": "GET /fa%73t HTTP/1.1\r\nHost: x\r\n\r\n",
		"absolute":     "GET http://x/fast HTTP/1.1\r\nHost: x\r\n\r\n",
		"oversize":     "GET /fast HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 20<<10) + "\r\n\r\n",
		"bare LF":      "GET /fast HTTP/1.1\nHost: x\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			rc := dialRaw(t, addr)
			rc.send(req)
			_, body, err := rc.try("GET")
			if err != nil || body != "fallback GET /fast " {
				t.Fatalf("got %q, %v; want the fallback's answer", body, err)
			}
		})
	}
}

// Bodies over MaxBody are not buffered by the fast path.
func TestServerBodyOverMaxBodyGoesToFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast, func(s *Server) { s.MaxBody = 16 })
	rc := dialRaw(t, addr)
	big := strings.Repeat("z", 100)
	rc.send(post("/fast", big))
	if _, body := rc.recv("POST"); body != "fallback POST /fast "+big {
		t.Fatalf("body %q", body)
	}
}

// A client's Connection: close must be honoured: announced and then acted on.
func TestServerClientConnectionCloseEndsConn(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	rc.send(post("/fast", "bye", "Connection: close"))
	resp, body := rc.recv("POST")
	if body != "fast POST /fast bye" || !resp.Close {
		t.Fatalf("body %q, Close %v", body, resp.Close)
	}
	rc.expectClosed()
}

// A handler asking to close (as net/http lets it) must get the conn closed.
func TestServerHandlerConnectionCloseHonoured(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	})
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	if resp, _ := rc.recv("GET"); !resp.Close {
		t.Fatal("response does not say Connection: close")
	}
	rc.expectClosed()
}

// A panicking handler must not take the server down, and leaves the client a 500.
func TestServerHandlerPanicGives500AndCloses(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) { panic("boom") })
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	resp, _ := rc.recv("GET")
	if resp.StatusCode != 500 || !resp.Close {
		t.Fatalf("status %d Close %v, want 500 and close", resp.StatusCode, resp.Close)
	}
	rc.expectClosed()
}

// A handler that fails mid-response must not have its partial output passed off as complete.
func TestServerPanicAfterWriteDoesNotLookComplete(t *testing.T) {
	for name, flush := range map[string]bool{"buffered": false, "flushed": true} {
		t.Run(name, func(t *testing.T) {
			addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
				w.WriteHeader(200)
				io.WriteString(w, "partial")
				if flush {
					w.Flush()
				}
				panic("boom")
			})
			rc := dialRaw(t, addr)
			rc.send(get("/fast"))
			if resp, body, err := rc.try("GET"); err == nil && resp.StatusCode == 200 {
				t.Fatalf("truncated output arrived as a complete 200: %q", body)
			}
		})
	}
}

// panic(http.ErrAbortHandler) means "abort the response", as in net/http (httputil.ReverseProxy uses it).
func TestServerAbortHandlerAbortsResponse(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	})
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	if resp, body, err := rc.try("GET"); err == nil {
		t.Fatalf("aborted response arrived complete: %d %q", resp.StatusCode, body)
	}
}

// Long handlers (SSE, slow tools) must learn when their client has gone.
func TestServerContextCanceledWhenClientLeaves(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			entered := make(chan struct{})
			canceled := make(chan bool, 1)
			addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
				close(entered)
				select {
				case <-r.Context().Done():
					canceled <- true
				case <-time.After(5 * time.Second):
					canceled <- false
				}
			})
			rc := dialRaw(t, addr)
			rc.send(method + " /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
			<-entered
			rc.c.Close()
			select {
			case ok := <-canceled:
				if !ok {
					t.Fatal("handler's context not cancelled")
				}
			case <-time.After(time.Second):
				t.Fatal("handler's context not cancelled within a second")
			}
		})
	}
}

// HEAD and 204 replies must carry no body, or the next response on the conn is misread.
func TestServerHeadAndNoContentHaveNoBody(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		if r.RawQuery == "204" {
			w.WriteHeader(http.StatusNoContent)
		}
		io.WriteString(w, "hello")
	})
	rc := dialRaw(t, addr)
	rc.send("HEAD /fast HTTP/1.1\r\nHost: x\r\n\r\n" + get("/fast?204") + get("/fast"))
	if resp, _ := rc.recv("HEAD"); resp.StatusCode != 200 {
		t.Fatalf("HEAD status %d", resp.StatusCode)
	}
	if resp, _ := rc.recv("GET"); resp.StatusCode != 204 || resp.Header.Get("Content-Length") != "" {
		t.Fatalf("204: status %d, Content-Length %q", resp.StatusCode, resp.Header.Get("Content-Length"))
	}
	if resp, body := rc.recv("GET"); resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("after HEAD and 204: %d %q (stray body bytes?)", resp.StatusCode, body)
	}
}

// RFC 9110 §8.6: a HEAD reply's Content-Length, if any, must be the GET body's length.
func TestServerHeadContentLengthMatchesGet(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		if r.RawQuery == "declared" { // a handler may state the length without writing the body
			w.Header().Set("Content-Length", "42")
			return
		}
		io.WriteString(w, "hello")
	})
	rc := dialRaw(t, addr)
	rc.send("HEAD /fast HTTP/1.1\r\nHost: x\r\n\r\nHEAD /fast?declared HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := rc.recv("HEAD"); resp.ContentLength != -1 && resp.ContentLength != 5 {
		t.Fatalf("HEAD Content-Length %d; want 5 or none", resp.ContentLength)
	}
	if resp, _ := rc.recv("HEAD"); resp.ContentLength != -1 && resp.ContentLength != 42 {
		t.Fatalf("HEAD with declared length: Content-Length %d; want 42 or none", resp.ContentLength)
	}
}

// Header values reach handlers from callers; CR/LF in them must not split the response head.
func TestServerHeaderValueCRLFDoesNotSplitHead(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		w.Header().Set("X-Evil", "a\r\nInjected: yes\r\n\r\nbody")
		io.WriteString(w, "real")
	})
	rc := dialRaw(t, addr)
	for range 2 {
		rc.send(get("/fast"))
		resp, body := rc.recv("GET")
		if resp.Header.Get("Injected") != "" || body != "real" {
			t.Fatalf("head split: Injected=%q body=%q", resp.Header.Get("Injected"), body)
		}
		if v := resp.Header.Get("X-Evil"); !strings.HasPrefix(v, "a") || !strings.Contains(v, "Injected") {
			t.Fatalf("X-Evil = %q", v)
		}
	}
}

// net/http drops invalid header names; writing them raw allows response splitting.
func TestServerInvalidHeaderNameDoesNotSplitHead(t *testing.T) {
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		w.Header()["X-A: 1\r\nInjected"] = []string{"yes"}
		io.WriteString(w, "real")
	})
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	resp, body := rc.recv("GET")
	if resp.Header.Get("Injected") != "" || body != "real" {
		t.Fatalf("head split: Injected=%q body=%q", resp.Header.Get("Injected"), body)
	}
}

// Idle clients must not hold connections forever.
func TestServerIdleTimeoutClosesConn(t *testing.T) {
	addr, _ := startServer(t, echoFast, func(s *Server) { s.IdleTimeout = 50 * time.Millisecond })
	rc := dialRaw(t, addr)
	rc.send(get("/fast"))
	rc.recv("GET")
	rc.expectClosed()
}

// Graceful shutdown: idle conns go at once, in-flight requests finish, then Shutdown returns.
func TestServerShutdownWaitsForInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	addr, s := startServer(t, func(w *ResponseWriter, r *Request) {
		if r.RawQuery == "block" {
			close(entered)
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		}
		io.WriteString(w, "done")
	})
	idle := dialRaw(t, addr)
	idle.send(get("/fast"))
	idle.recv("GET")
	busy := dialRaw(t, addr)
	busy.send(get("/fast?block"))
	<-entered

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	idle.expectClosed()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if _, body := busy.recv("GET"); body != "done" {
		t.Fatalf("in-flight body %q", body)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the request finished")
	}
	busy.expectClosed()
}

// When Shutdown's grace ends, in-flight handlers are cancelled rather than waited for forever.
func TestServerShutdownDeadlineCancelsInFlight(t *testing.T) {
	entered, canceled := make(chan struct{}), make(chan bool, 1)
	addr, s := startServer(t, func(w *ResponseWriter, r *Request) {
		close(entered)
		select {
		case <-r.Context().Done():
			canceled <- true
		case <-time.After(5 * time.Second):
			canceled <- false
		}
	})
	rc := dialRaw(t, addr)
	rc.send(post("/fast", ""))
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v; want context.DeadlineExceeded", err)
	}
	if !<-canceled {
		t.Fatal("in-flight handler's context not cancelled")
	}
	// The cancelled handler may return before its connection is closed,
	// and then its (empty) answer is written: what matters is that the
	// connection ends.
	rc.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.Copy(io.Discard, rc.br); err != nil {
		t.Fatalf("connection not closed: %v", err)
	}
}

// net/http half-closes before hanging up on an unread body, so the client gets its answer and
// a clean EOF, not a reset; the handed-off conn must still offer CloseWrite for that.
func TestServerFallbackCanHalfCloseHandedConn(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	rc := dialRaw(t, addr)
	const size = 1 << 20 // > net/http's 256 KiB discard limit
	go func() {
		io.WriteString(rc.c, fmt.Sprintf("POST /noread HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size))
		rc.c.Write(make([]byte, size)) // blocks, then fails when the server hangs up
	}()
	if _, body := rc.recv("POST"); body != "early" {
		t.Fatalf("body %q", body)
	}
	if _, err := rc.br.ReadByte(); err != io.EOF {
		t.Fatalf("after the response: %v; want io.EOF from a half-close", err)
	}
}

// final reads responses until one that is not 1xx (net/http answers
// Expect: 100-continue with one first).
func (rc *rawClient) final(method string) (*http.Response, string) {
	rc.t.Helper()
	for {
		resp, body := rc.recv(method)
		if resp.StatusCode >= 200 {
			return resp, body
		}
	}
}

// Header names reach handlers in canonical form, whatever their case, and
// repeated fields keep all their values in order, as net/http has them.
func TestServerHeaderFieldsAsNetHTTPReadsThem(t *testing.T) {
	got := make(chan *Request, 2)
	addr, _ := startServer(t, func(w *ResponseWriter, r *Request) {
		got <- r
		echoFast(w, r)
	})
	const head = "POST /fast HTTP/1.1\r\nhost: example.com\r\ncontent-type: text/plain\r\nx-MiXeD-cAsE: m\r\n" +
		"X-Already-Canonical: c\r\nx-r: 1\r\nX-Other: o\r\nX-R: 2\r\nX-r: 3\r\nX-Tok!#$%&'*+.^_`|~: tok\r\n" +
		"X-Value: a\tb caf\xc3\xa9 \t\r\nX-Empty:\r\nCONTENT-LENGTH: 000000000005\r\n\r\n"
	rc := dialRaw(t, addr)
	rc.send(head + "hello" + get("/fast"))
	if _, body := rc.recv("POST"); body != "fast POST /fast hello" {
		t.Fatalf("body %q; want the fast handler's, with the body read", body)
	}
	if _, body := rc.recv("GET"); body != "fast GET /fast " {
		t.Fatalf("next request: %q", body)
	}
	r := <-got
	want, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head + "hello")))
	if err != nil {
		t.Fatal(err)
	}
	want.Header["Host"] = []string{want.Host} // net/http moves it out of Header
	if !reflect.DeepEqual(r.Header(), want.Header) {
		t.Errorf("Header\n%q\nnet/http reads\n%q", r.Header(), want.Header)
	}
	if r.Host != "example.com" {
		t.Errorf("Host %q", r.Host)
	}
}

// Heads the fast path must not judge go to net/http whole: ambiguous
// framing or Host, a header name that is not a token, a value with a
// control character, and the fields that change how the message is read.
// Each is answered by net/http (its 400, or the Fallback's echo), never by
// the fast handler.
func TestServerHandsAmbiguousHeadsToFallback(t *testing.T) {
	addr, _ := startServer(t, echoFast)
	type want struct {
		status int
		body   string // when 200
	}
	const fb = "fallback POST /fast hello"
	cases := map[string]struct {
		req  string
		want want
	}{
		"two Hosts":                      {"GET /fast HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", want{400, ""}},
		"two equal Content-Lengths":      {"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", want{200, fb}},
		"two different Content-Lengths":  {"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\nhello!", want{400, ""}},
		"Content-Length not digits":      {"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 5x\r\n\r\nhello", want{400, ""}},
		"Content-Length signed":          {"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", want{400, ""}},
		"Content-Length of 13 digits":    {"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 0000000000005\r\n\r\nhello", want{200, fb}},
		"value with a control character": {"POST /fast HTTP/1.1\r\nHost: x\r\nX-Ctl: a\x01b\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"value with DEL":                 {"POST /fast HTTP/1.1\r\nHost: x\r\nX-Ctl: a\x7fb\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"value with NUL":                 {"POST /fast HTTP/1.1\r\nHost: x\r\nX-Ctl: a\x00b\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"name with a space":              {"POST /fast HTTP/1.1\r\nHost: x\r\nBad Name: v\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"name with DEL":                  {"POST /fast HTTP/1.1\r\nHost: x\r\nBad\x7fName: v\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"name with a high byte":          {"POST /fast HTTP/1.1\r\nHost: x\r\nBad\x80Name: v\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}},
		"lowercase transfer-encoding":    {"POST /fast HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", want{200, fb}},
		"Expect":                         {"POST /fast HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", want{200, fb}},
		"Upgrade":                        {"POST /fast HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 5\r\n\r\nhello", want{200, fb}},
		"TE":                             {"POST /fast HTTP/1.1\r\nHost: x\r\nte: trailers\r\nContent-Length: 5\r\n\r\nhello", want{200, fb}},
		"Trailer":                        {"POST /fast HTTP/1.1\r\nHost: x\r\nTrailer: X-T\r\nContent-Length: 5\r\n\r\nhello", want{200, fb}},
	}
	for _, c := range `"(),/;<=>?@[\]{}` {
		cases["name with "+string(c)] = struct {
			req  string
			want want
		}{"POST /fast HTTP/1.1\r\nHost: x\r\nBad" + string(c) + "Name: v\r\nContent-Length: 5\r\n\r\nhello", want{400, ""}}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			rc := dialRaw(t, addr)
			rc.send(c.req)
			resp, body := rc.final("POST")
			if strings.HasPrefix(body, "fast ") {
				t.Fatalf("the fast handler answered %q", body)
			}
			if resp.StatusCode != c.want.status || c.want.status == 200 && body != c.want.body {
				t.Fatalf("got %d %q; want %d %q", resp.StatusCode, body, c.want.status, c.want.body)
			}
		})
	}
}
