package server

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// liveSessions mirrors the 2025-11-25 sessions mcp-go holds, registered at
// initialize and dropped at DELETE (mcp-go's hooks tell both), so that the
// fast call can read a session's negotiated version and client
// capabilities, and whether it asked for log messages, without going
// through mcp-go's per-request machinery. It grows and shrinks with
// mcp-go's own table.
type liveSessions struct {
	m     sync.Map // session id → *liveSession
	count atomic.Int64
	// The bounds (expire.go): forget drops a session; nil: unbounded.
	lim    SessionLimits
	forget func(*liveSession)
	armed  atomic.Bool // a sweep is due
}

// sessionInfo is what mcp-go's streamable-HTTP sessions say of a client.
type sessionInfo interface {
	mcpserver.ClientSession
	ProtocolVersion() string
	GetClientCapabilities() mcp.ClientCapabilities
}

type liveSession struct {
	sessionInfo              // nil for a session of another transport (stdio)
	id, sub     string       // the session's id, and the subject that opened it
	last        atomic.Int64 // unix nanos of its latest request
	// leveled: the client sent logging/setLevel. Until it does, capgate
	// relays no upstream log message to it (the spec leaves the choice to
	// the server), so a plain call has nothing to stream.
	leveled  atomic.Bool
	inflight sync.Map // JSON-RPC id as sent → *inflightCall
	// owner is the subject whose MAC the session's id passed
	// (ownsSession), so that its later requests skip the MAC.
	owner atomic.Pointer[string]
}

// inflightCall is a fast call notifications/cancelled can end.
type inflightCall struct{ cancel context.CancelFunc }

// hook registers the mirror's upkeep on mcp-go's hooks.
func (l *liveSessions) hook(h *mcpserver.Hooks) {
	h.AddOnRegisterSession(func(ctx context.Context, s mcpserver.ClientSession) {
		if s.SessionID() != "" {
			info, _ := s.(sessionInfo)
			ls := &liveSession{sessionInfo: info, id: s.SessionID()}
			if c := CallerFrom(ctx); c != nil {
				ls.sub = c.Sub
			}
			if _, loaded := l.m.Swap(s.SessionID(), ls); !loaded {
				l.opened(ls)
			}
		}
	})
	h.AddOnUnregisterSession(func(_ context.Context, s mcpserver.ClientSession) {
		if _, ok := l.m.LoadAndDelete(s.SessionID()); ok {
			l.count.Add(-1)
		}
	})
	h.AddAfterSetLevel(func(ctx context.Context, _ any, _ *mcp.SetLevelRequest, _ *mcp.EmptyResult) {
		if s := l.of(ctx); s != nil {
			s.leveled.Store(true)
		}
	})
}

// get is the live, initialized session id names, or nil.
func (l *liveSessions) get(id string) *liveSession {
	if id == "" {
		return nil
	}
	v, ok := l.m.Load(id)
	if !ok {
		return nil
	}
	s := v.(*liveSession)
	if s.sessionInfo == nil || !s.Initialized() {
		return nil
	}
	return s
}

// of is the live session of a request mcp-go serves, or nil (on protocol
// 2026-07-28 there is none).
func (l *liveSessions) of(ctx context.Context) *liveSession {
	cs := mcpserver.ClientSessionFromContext(ctx)
	if cs == nil || cs.SessionID() == "" {
		return nil
	}
	v, ok := l.m.Load(cs.SessionID())
	if !ok {
		return nil
	}
	return v.(*liveSession)
}

// asksNothing says whether the session's client declared nothing an
// upstream could ask of it mid-call, and asked for no log messages.
func (s *liveSession) asksNothing() bool {
	c := s.GetClientCapabilities()
	return c.Sampling == nil && c.Elicitation == nil && c.Roots == nil && !s.leveled.Load()
}

// track makes ctx cancellable by the session's notifications/cancelled
// for the request id, until done.
func (s *liveSession) track(ctx context.Context, id []byte) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancel(ctx)
	key, call := string(id), &inflightCall{cancel}
	s.inflight.Store(key, call)
	return ctx, func() {
		s.inflight.CompareAndDelete(key, call)
		cancel()
	}
}

// cancel cancels the fast call whose id (as JSON) is id, if one runs.
func (s *liveSession) cancel(id []byte) {
	if v, ok := s.inflight.Load(string(id)); ok {
		v.(*inflightCall).cancel()
	}
}
