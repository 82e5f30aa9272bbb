package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// The front door's robustness, through a real capgate serve over real
// sockets.

// frontConfig: a small body limit and header deadline, an anonymous caller
// and no sources, so that the tests measure the front door alone. The keys
// before the first table belong to StartCapgate's [server].
const frontConfig = `header_timeout = "1s"
max_request_bytes = "4KiB"

[policy]
grants = ["rye.fetch.*"]
`

// rawRequest writes head (and no body) on a new connection and returns
// the status line serve answers within 5 s.
func rawRequest(t *testing.T, addr, head string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	return strings.TrimSpace(line)
}

// A request without a token is refused before capgate reads any of its
// body: the 401 comes while the announced 4 MiB have not been sent.
func TestFrontRefusesBeforeReadingTheBody(t *testing.T) {
	t.Parallel()
	s := testkit.StartCapgate(t, testkit.Capgate{Config: strings.Replace(frontConfig, "4KiB", "8MiB", 1)})
	head := "POST /mcp HTTP/1.1\r\nHost: " + s.Addr + "\r\nContent-Type: application/json\r\nContent-Length: 4194304\r\n\r\n"
	if got := rawRequest(t, s.Addr, head); got != "HTTP/1.1 401 Unauthorized" {
		t.Errorf("a token-less request with an unsent body: %q", got)
	}
}

// An authenticated body over max_request_bytes is 413, announced (then
// capgate reads none of it) or not (then it stops at the limit), on /mcp
// and /rpc.
func TestFrontOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	s := testkit.StartCapgate(t, testkit.Capgate{Config: frontConfig})
	tok := s.Token(t, token.Claims{Sub: "alice"})
	for _, path := range []string{"/mcp", "/rpc"} {
		head := "POST " + path + " HTTP/1.1\r\nHost: " + s.Addr + "\r\nAuthorization: Bearer " + tok +
			"\r\nContent-Type: application/json\r\nContent-Length: 4097\r\n\r\n"
		if got := rawRequest(t, s.Addr, head); got != "HTTP/1.1 413 Request Entity Too Large" {
			t.Errorf("%s, 4097 bytes announced: %q", path, got)
		}
		// Chunked, so nothing is announced: the limit is found reading.
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}`
		req, _ := http.NewRequest("POST", s.URL+path, io.MultiReader(strings.NewReader(body))) // length unknown
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge ||
			!strings.Contains(string(b), "at most 4096 bytes") {
			t.Errorf("%s, a chunked body of %d bytes: %d %s", path, len(body), resp.StatusCode, b)
		}
	}
	// A body within the limit is read and answered.
	if st, _, b := testkit.PostMCP(t, s.URL, tok, "nope", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope","arguments":{},`+modernMeta+`}}`); st == http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "'nope' not found") {
		t.Errorf("a small body: %d %s", st, b)
	}
}

// A client sending its headers a byte at a time is cut at header_timeout
// from its first byte, however steadily it sends.
func TestFrontCutsATricklingClient(t *testing.T) {
	t.Parallel()
	s := testkit.StartCapgate(t, testkit.Capgate{Config: frontConfig})
	c, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: " + s.Addr + "\r\nX-Pad: " + strings.Repeat("a", 200)
	start := time.Now()
	for i := 0; i < len(head); i++ {
		if _, err := c.Write([]byte{head[i]}); err != nil {
			break // cut
		}
		time.Sleep(50 * time.Millisecond) // the whole head would take 10 s
		if i%10 == 0 {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				break // closed by serve
			}
		}
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("a trickling client held its connection for %v (header_timeout 1s)", took)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// capgate keeps serving when it runs out of file descriptors: accept fails
// for a while (net/http backs off and retries), and once connections close
// the next request is served by the same process.
func TestFrontSurvivesDescriptorExhaustion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	cfg := filepath.Join(dir, "capgate.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("[server]\nlisten = %q\ndata_dir = \"data\"\nsocket = \"-\"\n%s", addr, frontConfig)), 0o600)
	// bash sets both limits: Go raises a soft limit to the hard one.
	_, _, logs := testkit.ServeArgs(t, "bash", []string{"-c", `ulimit -n 40 && exec "$0" serve --config "$1"`,
		testkit.Build(t, capgatePkg), cfg}, "CAPGATE_TOKEN_SECRET=front-test-secret-2b7a")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 80 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break // the backlog is full: descriptors are exhausted
		}
		conns = append(conns, c)
	}
	// While exhausted, accept fails; serve must not exit.
	if !testkit.Poll(10*time.Second, func() bool { return strings.Contains(logs(), "too many open files") }) {
		t.Fatalf("%d connections did not exhaust serve's descriptors; its log:\n%s", len(conns), logs())
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	var last error
	if testkit.Poll(15*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/.well-known/oauth-protected-resource/mcp")
		if last = err; err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
			last = fmt.Errorf("status %d", resp.StatusCode)
		}
		return false
	}) {
		return
	}
	t.Fatalf("serve did not serve again after its descriptors were freed: %v\n%s", last, logs())
}

// /healthz and /readyz answer without a token; after SIGTERM, /readyz
// fails for drain_delay while calls are still served, then serve exits.
func TestFrontHealthAndDrain(t *testing.T) {
	t.Parallel()
	s := testkit.StartCapgate(t, testkit.Capgate{Config: "drain_delay = \"3s\"\n" + frontConfig})
	get := func(path string) (int, string) {
		resp, err := http.Get(s.URL + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := get("/healthz"); st != 200 || b != "ok\n" {
		t.Errorf("/healthz: %d %q", st, b)
	}
	if st, b := get("/readyz"); st != 200 || b != "ready\n" {
		t.Errorf("/readyz: %d %q", st, b)
	}
	exited := make(chan error, 1)
	s.Cmd.Process.Signal(syscall.SIGTERM)
	go func() { exited <- s.Cmd.Wait() }()
	var st int
	var b string
	if !testkit.Poll(2*time.Second, func() bool {
		st, b = get("/readyz")
		return st == http.StatusServiceUnavailable && strings.Contains(b, "draining")
	}) {
		t.Fatalf("/readyz after SIGTERM: %d %q", st, b)
	}
	// Still serving while the balancer notices.
	tok := s.Token(t, token.Claims{Sub: "alice"})
	if st, _, b := testkit.PostMCP(t, s.URL, tok, "nope", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope","arguments":{},`+modernMeta+`}}`); !strings.Contains(string(b), "'nope' not found") {
		t.Errorf("a call while draining: %d %s", st, b)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("serve exited with %v\n%s", err, s.Logs())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not exit after draining\n%s", s.Logs())
	}
}
