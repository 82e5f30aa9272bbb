package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/token"
)

// TestDrainUnderLoad (issue 30 item 6): two replicas on PostgreSQL behind
// haproxy with the example's health check (every 500 ms, down after 2
// failures) and a drain_delay longer than that; 6 clients send keyed calls
// without pause while each replica in turn gets SIGTERM and is started
// again. No call fails, and each replica exits once the calls it was
// running are answered. How long after its drain each exited is logged:
// net/http's Shutdown looked for idle connections every 500 ms at most,
// which added up to that much after the last answer (9-94 ms measured
// here; 1.3-1.7 s in all was seen in the issue); serve now stops the
// moment its last answer is written. That is a timing, so it is only
// logged; TestDrainAnswersOnIdleConnections is the check of the drain
// that fails without the fix.
func TestDrainUnderLoad(t *testing.T) {
	t.Parallel()
	haproxy := lookHAProxy(t)
	url := pgtest.Start(t)
	server, grant, _ := onceServer(t)
	cfg := fmt.Sprintf("[policy]\ngrants = [%q]\n\n", grant) + server + fmt.Sprintf("\n[store]\nurl = %q\n\n[idempotency]\nlease = \"6s\"\nwait = \"5s\"\n", url)
	const secret = "drain-test-secret-0123456789abcdef"
	env := []string{"CAPGATE_STORE_KEY=" + strings.Repeat("7b", 32)}
	start := func(addr string) *testkit.Served {
		return testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Config: cfg, Env: env, Addr: addr,
			Server: "drain_delay = \"2s\"\n"})
	}
	reps := []*testkit.Served{start(""), start("")}
	lb := startHAProxy(t, haproxy, reps[0].Addr, reps[1].Addr, append(safeBalancer, "default-server inter 500ms fall 2 rise 2")...)
	lb.waitStatus(t, map[string]string{"r1": "UP", "r2": "UP"})
	client := &http.Client{Timeout: 15 * time.Second}
	var stop atomic.Bool
	var calls, failed atomic.Int64
	var wg sync.WaitGroup
	// The clients stop when the test ends, also when it ends early: a
	// client logging after the end panics the whole test binary.
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
	for c := range 6 {
		tok := reps[0].Token(t, token.Claims{Sub: fmt.Sprint("drain", c), ChatType: "private"})
		wg.Go(func() {
			for k := 0; !stop.Load(); k++ {
				key := fmt.Sprintf("d-%d-%d", c, k)
				a := keyedCall(client, lb.addr, tok, "mcp:runs:quick", `{"n":"`+key+`"}`, key)
				calls.Add(1)
				if a.Err != nil || a.Code != "" || a.Output == "" {
					failed.Add(1)
					t.Logf("call %s failed: %+v", key, a)
				}
			}
		})
	}
	testkit.WaitFor(t, 2*time.Minute, "calls to flow", func() bool { return calls.Load() > 30 })
	for round := range 2 {
		i := round % 2
		sent := time.Now()
		if err := reps[i].Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		err := reps[i].Cmd.Wait()
		took := time.Since(sent)
		if err != nil {
			t.Errorf("r%d exited with %v\n%s", i+1, err, reps[i].Logs())
		}
		t.Logf("round %d: r%d exited %v after SIGTERM (drain 2s)", round, i+1, took.Round(time.Millisecond))
		reps[i] = start(reps[i].Addr)
		lb.waitStatus(t, map[string]string{"r1": "UP", "r2": "UP"})
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d calls, %d failed", calls.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d calls failed across the rolling restart", failed.Load(), calls.Load())
	}
}

// TestDrainAnswersOnIdleConnections (issue 30 item 6): a connection a
// balancer keeps idle to a replica is not closed under it when the drain
// begins (the balancer may be sending a call on it at that moment, and
// would lose it): a call sent on it during the drain is answered, with
// Connection: close, and then the replica closes it. One that stays idle
// through the drain is closed by the replica once the drain ends, and
// serve exits 0. Before the fix, the drain's start closed every idle
// connection (SetKeepAlivesEnabled(false)), and the call got no answer.
// No timing is asserted; the drain (10 s) is long so that a loaded
// machine cannot end it before the call is sent (the steps in it take
// about 1 s idle), and the test runs in parallel.
func TestDrainAnswersOnIdleConnections(t *testing.T) {
	t.Parallel()
	pack, log := oncePack(t)
	srv := testkit.StartCapgate(t, testkit.Capgate{Config: pack, Server: "drain_delay = \"10s\"\n"})
	tok := srv.Token(t, token.Claims{Sub: "dana", ChatType: "private"})
	call := func(key string) *http.Request {
		body := `{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":"` + tok +
			`","capability":"ext:once:quick","idempotency_key":"` + key + `","input":{"n":"` + key + `"}}}`
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/rpc", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	// Two connections, each answered once and then idle (kept alive).
	type conn struct {
		net.Conn
		r *bufio.Reader
	}
	open := func(key string) conn {
		nc, err := net.Dial("tcp", srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		c := conn{nc, bufio.NewReader(nc)}
		resp, body := roundTripOn(t, c.Conn, c.r, call(key))
		if resp.StatusCode != http.StatusOK || resp.Close || !strings.Contains(body, `"result"`) {
			t.Fatalf("a call before the drain: %s close=%v %s", resp.Status, resp.Close, body)
		}
		return c
	}
	used, idle := open("before-1"), open("before-2")

	if err := srv.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Cmd.Wait() }()
	// The drain has begun once serve logs it (after what it does at the
	// drain's start) and /readyz fails.
	testkit.WaitFor(t, 10*time.Second, "serve to log its drain", func() bool {
		return strings.Contains(srv.Logs(), "draining: /readyz fails")
	})
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := probe.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatalf("/readyz during the drain: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz during the drain: %s, want 503", resp.Status)
	}

	// A call on the idle connection is answered, and closes it.
	resp, body := roundTripOn(t, used.Conn, used.r, call("during"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"result"`) {
		t.Errorf("a call on an idle connection during the drain: %s %s", resp.Status, body)
	}
	if !resp.Close {
		t.Errorf("an answer during the drain does not say Connection: close: %v", resp.Header)
	}
	if err := closedByServer(used.Conn, used.r, 10*time.Second); err != nil {
		t.Errorf("the connection answered during the drain: %v", err)
	}
	if r := onceRuns(t, log)[`{"n":"during"}`]; r == nil || r.done != 1 {
		t.Errorf("the call made during the drain ran %+v, want once", r)
	}
	// The other idle one is closed by serve when the drain ends (10 s).
	if err := closedByServer(idle.Conn, idle.r, time.Minute); err != nil {
		t.Errorf("the connection idle through the drain: %v", err)
	}
	if err := <-exited; err != nil {
		t.Errorf("serve exited with %v after its drain\n%s", err, srv.Logs())
	}
}

// roundTripOn writes req on c and reads its answer from r (net/http does
// the framing both ways).
func roundTripOn(t *testing.T, c net.Conn, r *bufio.Reader, req *http.Request) (*http.Response, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := req.Write(c); err != nil {
		t.Fatalf("%s %s: write: %v", req.Method, req.URL.Path, err)
	}
	resp, err := http.ReadResponse(r, req)
	if err != nil {
		t.Fatalf("%s %s on a kept-alive connection: no answer: %v", req.Method, req.URL.Path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	return resp, string(b)
}

// closedByServer waits, up to within, for the server to close c: a read
// that ends in EOF (or a reset) with nothing read.
func closedByServer(c net.Conn, r *bufio.Reader, within time.Duration) error {
	c.SetReadDeadline(time.Now().Add(within))
	n, err := r.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case n > 0:
		return errors.New("the server sent more on it instead of closing it")
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("still open after %v", within)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return nil
	default:
		return fmt.Errorf("reading it: %v", err)
	}
}
