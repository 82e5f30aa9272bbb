package server

import (
	"runtime"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

func held(m *MCP, id string) bool {
	_, ok := m.live.m.Load(id)
	return ok
}

// TestSessionCapForgetsOldestIdle: at the cap, opening a session forgets
// the one idle longest (not the oldest opened, which was used since). The
// mirror drops a session only on mcp-go's unregister hook, so a session
// gone from it is gone from mcp-go.
func TestSessionCapForgetsOldestIdle(t *testing.T) {
	s, url := serveSetup(t, setup{})
	s.MCP.live.limit(SessionLimits{Max: 3, Idle: time.Hour}, s.MCP.forget)
	tok := mint(t, token.Claims{Sub: "alice"})
	a := testkit.OpenSession(t, url, tok, "{}")
	b := testkit.OpenSession(t, url, tok, "{}")
	c := testkit.OpenSession(t, url, tok, "{}")
	if st, _, body := testkit.PostSession(t, url, tok, a, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); st != 200 {
		t.Fatalf("ping in a: %d %s", st, body)
	}
	d := testkit.OpenSession(t, url, tok, "{}")
	if !held(s.MCP, a) || held(s.MCP, b) || !held(s.MCP, c) || !held(s.MCP, d) || s.MCP.Sessions() != 3 {
		t.Errorf("held a %v b %v c %v d %v, %d sessions; want b forgotten, 3 held", held(s.MCP, a), held(s.MCP, b), held(s.MCP, c), held(s.MCP, d), s.MCP.Sessions())
	}
}

// TestIdleSessionsForgotten: sessions that send nothing past the idle
// limit are forgotten (by mcp-go: see above).
func TestIdleSessionsForgotten(t *testing.T) {
	s, url := serveSetup(t, setup{})
	s.MCP.live.limit(SessionLimits{Idle: 100 * time.Millisecond}, s.MCP.forget)
	tok := mint(t, token.Claims{Sub: "alice"})
	testkit.OpenSession(t, url, tok, "{}")
	testkit.OpenSession(t, url, tok, "{}")
	deadline := time.Now().Add(10 * time.Second)
	for s.MCP.Sessions() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still held 10 s after they went idle", s.MCP.Sessions())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkSessionMemory reports the heap one open 2025-11-25 session
// holds (initialize and notifications/initialized, over HTTP), the cost
// [server] max_sessions multiplies.
func BenchmarkSessionMemory(b *testing.B) {
	s, url := serveSetup(b, setup{})
	s.MCP.live.limit(SessionLimits{Max: 1 << 30, Idle: time.Hour}, s.MCP.forget)
	tok := mint(b, token.Claims{Sub: "bench"})
	testkit.OpenSession(b, url, tok, "{}") // warm up
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		testkit.OpenSession(b, url, tok, "{}")
		n++
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "B/session")
}
