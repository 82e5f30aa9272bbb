package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/tool"
)

// A call's POST is a copy of the link's head: every one carries the
// link's headers and its own body, also when calls run at once.
func TestCallsCarryTheLinkHead(t *testing.T) {
	addr := freeAddr(t)
	httpFixture(t, addr)

	type seen struct {
		header http.Header
		length int64
		body   string
	}
	var mu sync.Mutex
	var calls []seen
	up, _ := url.Parse("http://" + addr)
	rp := httputil.NewSingleHostReverseProxy(up)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && bytes.Contains(b, []byte(`"tools/call"`)) {
			mu.Lock()
			calls = append(calls, seen{r.Header.Clone(), r.ContentLength, string(b)})
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		rp.ServeHTTP(w, r)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	s := connect(t, Options{Name: "fx", URL: "http://" + ln.Addr().String() + "/mcp", Timeout: 10 * time.Second,
		Headers: map[string]string{"X-Upstream-Key": "k1"}})
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	echo := find(t, ds, "echo")
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := fmt.Sprintf("m%d", i)
			r, err := s.Call(context.Background(), tool.Call{Tool: echo, Input: json.RawMessage(`{"message":"` + msg + `"}`)})
			if err != nil {
				errs <- err
				return
			}
			if string(r.Structured) != `{"message":"`+msg+`"}` {
				errs <- fmt.Errorf("call %d got %s", i, r.Structured)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(calls) != n {
		t.Fatalf("%d tools/call POSTs reached the upstream, want %d", len(calls), n)
	}
	bodies := map[string]bool{}
	for _, c := range calls {
		h := c.header
		if h.Get("X-Upstream-Key") != "k1" || h.Get("Content-Type") != "application/json" ||
			!strings.Contains(h.Get("Accept"), "text/event-stream") || h.Get("Mcp-Protocol-Version") == "" {
			t.Errorf("a call's head lacks the link's headers: %v", h)
		}
		if c.length != int64(len(c.body)) {
			t.Errorf("Content-Length %d for a body of %d bytes", c.length, len(c.body))
		}
		bodies[c.body] = true
	}
	if len(bodies) != n {
		t.Errorf("%d different bodies among %d calls: %v", len(bodies), n, bodies)
	}
}
