package server

import (
	"context"
	"net/http"
	"slices"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/router"
)

// mcp-go keeps every 2025-11-25 session it opened until a DELETE, and
// clients rarely send one: without a bound, initialize after initialize
// grows memory for ever. capgate forgets a session idle past
// SessionLimits.Idle, and past SessionLimits.Max open sessions it forgets
// the one idle longest to make room. Forgetting is a DELETE of the
// session given to mcp-go's own handler, which drops all it holds for it;
// a client that comes back with the id gets a fresh session (see
// session.go), as after a restart.

// SessionLimits bound the MCP sessions held.
type SessionLimits struct {
	Idle time.Duration // default 30m
	Max  int           // default 4096
}

const (
	defaultSessionIdle = 30 * time.Minute
	defaultMaxSessions = 4096
)

// Sessions is how many MCP sessions are held now.
func (m *MCP) Sessions() int { return int(m.live.count.Load()) }

// limit sets the bounds, and forget, which drops one session.
func (l *liveSessions) limit(lim SessionLimits, forget func(*liveSession)) {
	if lim.Idle <= 0 {
		lim.Idle = defaultSessionIdle
	}
	if lim.Max <= 0 {
		lim.Max = defaultMaxSessions
	}
	l.lim, l.forget = lim, forget
}

// opened counts a registered session and makes room for it.
func (l *liveSessions) opened(s *liveSession) {
	s.last.Store(time.Now().UnixNano())
	if n := l.count.Add(1); l.forget != nil && n > int64(l.lim.Max) {
		l.forgetOldest(s)
	}
	if l.forget != nil && l.armed.CompareAndSwap(false, true) {
		time.AfterFunc(l.sweepEvery(), l.sweep)
	}
}

// touch records a request in the session id names.
func (l *liveSessions) touch(id string) {
	if id == "" {
		return
	}
	if v, ok := l.m.Load(id); ok {
		v.(*liveSession).last.Store(time.Now().UnixNano())
	}
}

func (l *liveSessions) sweepEvery() time.Duration {
	return min(max(l.lim.Idle/4, 50*time.Millisecond), time.Minute)
}

// sweep forgets the sessions idle past the limit, and comes again while
// any is open (so a server with none holds no timer).
func (l *liveSessions) sweep() {
	cutoff := time.Now().Add(-l.lim.Idle).UnixNano()
	l.m.Range(func(_, v any) bool {
		if s := v.(*liveSession); s.last.Load() < cutoff {
			l.forget(s)
		}
		return true
	})
	if l.count.Load() > 0 {
		time.AfterFunc(l.sweepEvery(), l.sweep)
		return
	}
	l.armed.Store(false)
	if l.count.Load() > 0 && l.armed.CompareAndSwap(false, true) { // one opened meanwhile
		time.AfterFunc(l.sweepEvery(), l.sweep)
	}
}

// forgetOldest forgets the session idle longest, other than keep. A scan:
// it runs only when the cap is reached.
func (l *liveSessions) forgetOldest(keep *liveSession) {
	var oldest *liveSession
	l.m.Range(func(_, v any) bool {
		if s := v.(*liveSession); s != keep && (oldest == nil || s.last.Load() < oldest.last.Load()) {
			oldest = s
		}
		return true
	})
	if oldest != nil {
		l.forget(oldest)
	}
}

// forget drops s as a DELETE from its subject would: through mcp-go's own
// handler, so that everything it keeps for the session goes.
func (m *MCP) forget(s *liveSession) {
	ctx := WithCaller(context.Background(), &router.Caller{Sub: s.sub})
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "/mcp", nil)
	if err == nil {
		req.Header.Set(mcpserver.HeaderKeySessionID, s.id)
		if s.sessionInfo != nil {
			req.Header.Set("MCP-Protocol-Version", s.ProtocolVersion())
		}
		m.stream.ServeHTTP(discard{}, req)
	}
	m.srv.UnregisterSession(ctx, s.id) // whatever the DELETE said (idempotent)
}

// discard is a ResponseWriter nobody reads.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// SessionView is one held MCP session as an operator sees it: who opened
// it, at which protocol, and when it was last used; never its id, which
// a client presents as its session's key.
type SessionView struct {
	Sub, Protocol string
	LastUsed      time.Time
}

// SessionList lists the MCP sessions held now, most recently used first.
func (m *MCP) SessionList() []SessionView {
	var out []SessionView
	m.live.m.Range(func(_, v any) bool {
		s := v.(*liveSession)
		sv := SessionView{Sub: s.sub, LastUsed: time.Unix(0, s.last.Load())}
		if s.sessionInfo != nil {
			sv.Protocol = s.ProtocolVersion()
		}
		out = append(out, sv)
		return true
	})
	slices.SortFunc(out, func(a, b SessionView) int { return b.LastUsed.Compare(a.LastUsed) })
	return out
}
