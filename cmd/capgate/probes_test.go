package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// rawGet sends req as written (HTTP/1.0, perhaps with no Host: what
// net/http's client cannot send) to addr over TCP and returns the status
// and body of the answer, which net/http parses.
func rawGet(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(req, " ")
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// ownIP is an address of one of this machine's interfaces that is not
// loopback, or "" when it has none.
func ownIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && !ip.Unmap().IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.Unmap().String()
			}
		}
	}
	return ""
}

// TestHealthProbes: a real serve on 127.0.0.1 answers /healthz and /readyz
// to the probes load balancers and orchestrators send (HTTP/1.0 with no
// Host, as haproxy's default check; a Host naming the machine's own
// address), while a foreign Host (a DNS-rebinding page) is still refused
// everywhere, and /mcp and /rpc take neither probe form.
func TestHealthProbes(t *testing.T) {
	t.Parallel()
	cg := testkit.StartCapgate(t, testkit.Capgate{})
	own := ownIP(t)
	_, port, _ := net.SplitHostPort(cg.Addr)
	probes := []struct{ name, req, want string }{
		{"healthz, HTTP/1.0, no Host", "GET /healthz HTTP/1.0\r\n\r\n", "ok\n"},
		{"readyz, HTTP/1.0, no Host", "GET /readyz HTTP/1.0\r\n\r\n", "ready\n"},
		{"readyz, HTTP/1.0, no Host, HEAD", "HEAD /readyz HTTP/1.0\r\n\r\n", ""},
	}
	if own != "" {
		host := net.JoinHostPort(own, port)
		probes = append(probes,
			struct{ name, req, want string }{"healthz, Host " + host, "GET /healthz HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n", "ok\n"},
			struct{ name, req, want string }{"readyz, HTTP/1.0, Host " + own, "GET /readyz HTTP/1.0\r\nHost: " + own + "\r\n\r\n", "ready\n"})
	} else {
		t.Log("this machine has no non-loopback address: the own-address probe is not tried")
	}
	for _, p := range probes {
		if status, body := rawGet(t, cg.Addr, p.req); status != http.StatusOK || body != p.want {
			t.Errorf("%s: %d %q, want 200 %q", p.name, status, body, p.want)
		}
	}

	// Still refused: a foreign Host on the probes and on the API, and the
	// probes' extra Hosts anywhere but the probes.
	refused := []struct{ name, req string }{
		{"healthz, Host attacker.example", "GET /healthz HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"},
		{"readyz, HTTP/1.0, Host attacker.example", "GET /readyz HTTP/1.0\r\nHost: attacker.example:" + port + "\r\n\r\n"},
		{"mcp, Host attacker.example", "POST /mcp HTTP/1.1\r\nHost: attacker.example\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"},
		{"mcp, HTTP/1.0, no Host", "POST /mcp HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"},
		{"rpc, HTTP/1.0, no Host", "POST /rpc HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"},
		{"the protected-resource metadata, no Host", "GET /.well-known/oauth-protected-resource HTTP/1.0\r\n\r\n"},
	}
	if own != "" {
		host := net.JoinHostPort(own, port)
		refused = append(refused,
			struct{ name, req string }{"mcp, Host " + host, "POST /mcp HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"},
			struct{ name, req string }{"rpc, Host " + host, "POST /rpc HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"})
	}
	for _, r := range refused {
		if status, body := rawGet(t, cg.Addr, r.req); status != http.StatusForbidden || !strings.Contains(body, "invalid Host header") {
			t.Errorf("%s: %d %q, want 403 invalid Host header", r.name, status, body)
		}
	}
	// The check has teeth only if the API answers a loopback Host: 401
	// (no token), not 403.
	if status, body := rawGet(t, cg.Addr, "POST /mcp HTTP/1.1\r\nHost: "+cg.Addr+"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"); status != http.StatusUnauthorized {
		t.Errorf("mcp with a loopback Host and no token: %d %q, want 401", status, body)
	}
}
