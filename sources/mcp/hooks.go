package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/tool"
)

// The per-caller seam. What capgate sends an upstream may depend on who a
// request is for (per-user upstream credentials, issue 27): Hooks let the
// app add headers to each request and keep each caller's requests on an
// upstream session of their own. Both hooks get the request's context,
// which carries the caller (server.CallerFrom), and run before anything is
// sent.

// AskFunc asks the client of the tools/call in progress one thing
// mid-call (MCP elicitation/create, sampling/createMessage, roots/list)
// and returns its answer: tool.Call.Ask.
type AskFunc = func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)

// Hooks vary an upstream's requests by caller. The zero value varies
// nothing.
type Hooks struct {
	// Headers returns headers to add to one request capgate sends the
	// upstream for ctx: an Authorization for this caller, say. They win over
	// Options.Headers. ask is set during a tools/call: an ask made with it
	// (an elicitation with a sign-in URL) goes through the same channel as
	// the upstream's own input requests, so both reach the client in the
	// same round. An error fails the request with that error (give it a
	// tool error code). Streamable HTTP only; stdio and SSE upstreams take
	// Options.Headers alone.
	Headers func(ctx context.Context, ask AskFunc) (http.Header, error)
	// SessionKey names the upstream session the requests for ctx use:
	// requests with different keys never share a session, and what the
	// upstream sends on a keyed session outside a call's own stream
	// (requests on its standalone stream, log messages) belongs to that
	// key's call in flight, so it is relayed there. "" is the shared
	// session, whose unowned messages are refused or dropped. A 2026-07-28
	// upstream has no sessions: every request carries its own headers and
	// the key changes nothing. Streamable HTTP only.
	SessionKey func(ctx context.Context) string
	// Protocol is the revision the caller behind ctx speaks, "" when
	// unknown. An upstream that speaks both 2026-07-28 and 2025-11-25 may
	// serve them differently (a 2025 client's sampling is a request on its
	// stream, a 2026 one's an input round): a caller of 2025-11-25 or
	// before is served on a 2025-11-25 session of the upstream, others on
	// 2026-07-28.
	Protocol func(ctx context.Context) string
	// Unauthorized is told that the upstream answered a tools/call with
	// 401 to the headers Headers gave: it returns new ones (a refreshed
	// token) and the call is sent once more. again is set when those were
	// refused too: then it returns the error the caller gets (sign in
	// again). Streamable HTTP tools/call only.
	Unauthorized func(ctx context.Context, refused http.Header, again bool) (http.Header, error)
}

// unauthorized asks the Unauthorized hook what to send instead of the
// headers in ctx that the upstream refused; ok false when there is no hook.
func (s *Source) unauthorized(ctx context.Context, again bool) (context.Context, bool, error) {
	if s.opts.Hooks.Unauthorized == nil {
		return ctx, false, nil
	}
	refused, _ := ctx.Value(headersKey{}).(http.Header)
	h, err := s.opts.Hooks.Unauthorized(ctx, refused, again)
	if err != nil {
		var te *tool.Error
		if !errors.As(err, &te) {
			err = tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: %v", s.opts.Name, err)
		}
		return ctx, true, err
	}
	// Over what the request had (Mcp-Method, Mcp-Name): only the
	// credential changes.
	return withMoreHeaders(ctx, h), true, nil
}

// legacyKey prefixes the SessionKey of a session at Protocol kept for
// the callers of an older revision than the upstream's.
const legacyKey = "2025-11-25\x00"

// maxKeyedSessions bounds the keyed upstream sessions one source keeps;
// over it the least recently used is closed.
const maxKeyedSessions = 256

type headersKey struct{}

// withHeaders runs the Headers hook for one request and keeps its answer
// in ctx, where every request made with ctx finds it (see addHeaders).
func (s *Source) withHeaders(ctx context.Context, ask AskFunc) (context.Context, error) {
	if s.opts.Hooks.Headers == nil {
		return ctx, nil
	}
	h, err := s.opts.Hooks.Headers(ctx, ask)
	if err != nil {
		var te *tool.Error
		if errors.As(err, &te) {
			return ctx, err
		}
		return ctx, tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: %v", s.opts.Name, err)
	}
	if len(h) == 0 {
		return ctx, nil
	}
	return context.WithValue(ctx, headersKey{}, h), nil
}

// withMoreHeaders returns ctx with more added to its request headers.
func withMoreHeaders(ctx context.Context, more http.Header) context.Context {
	if len(more) == 0 {
		return ctx
	}
	h, _ := ctx.Value(headersKey{}).(http.Header)
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	for k, v := range more {
		h[k] = v
	}
	return context.WithValue(ctx, headersKey{}, h)
}

// addHeaders sets on h the headers the hook gave for ctx.
func addHeaders(ctx context.Context, h http.Header) {
	extra, _ := ctx.Value(headersKey{}).(http.Header)
	for k, v := range extra {
		h[http.CanonicalHeaderKey(k)] = v
	}
}

// headerFunc gives mcp-go's transport the hook's headers for a request it
// sends with ctx; a request without them (the standalone stream, opened
// at dial) gets those of the dial.
func headerFunc(base *http.Header) func(ctx context.Context) map[string]string {
	return func(ctx context.Context) map[string]string {
		h, _ := ctx.Value(headersKey{}).(http.Header)
		if h == nil {
			h = *base
		}
		if len(h) == 0 {
			return nil
		}
		out := make(map[string]string, len(h))
		for k := range h {
			out[k] = h.Get(k)
		}
		return out
	}
}

// keyed holds the sessions of Hooks.SessionKey, by key.
type keyed struct {
	mu    sync.Mutex
	links map[string]*keyedLink
	tick  uint64
}

type keyedLink struct {
	ready chan struct{} // closed once l or err is set
	l     *link
	err   error
	used  uint64
}

// linkFor returns the link requests for ctx go on: the caller's own
// session when SessionKey names one and the upstream has sessions,
// otherwise the shared link.
func (s *Source) linkFor(ctx context.Context) (*link, error) {
	shared, err := s.client()
	if err != nil || !shared.http {
		return shared, err
	}
	key := ""
	if s.opts.Hooks.SessionKey != nil {
		key = s.opts.Hooks.SessionKey(ctx)
	}
	legacy := false
	if shared.modern() {
		if s.opts.Hooks.Protocol == nil {
			return shared, nil
		}
		v := s.opts.Hooks.Protocol(ctx)
		if v == "" || mcpgo.IsModernProtocol(v) {
			return shared, nil
		}
		legacy, key = true, legacyKey+key
	} else if key == "" || shared.session == "" {
		return shared, nil
	}
	s.keyed.mu.Lock()
	if s.keyed.links == nil {
		s.keyed.links = map[string]*keyedLink{}
	}
	s.keyed.tick++
	k, ok := s.keyed.links[key]
	if !ok {
		k = &keyedLink{ready: make(chan struct{})}
		s.keyed.links[key] = k
		s.evictKeyed()
	}
	k.used = s.keyed.tick
	s.keyed.mu.Unlock()
	if !ok {
		l, err := s.open(ctx, key, legacy)
		if err != nil {
			s.forgetKeyed(key, k)
		}
		k.l, k.err = l, err
		close(k.ready)
	}
	select {
	case <-k.ready:
	case <-ctx.Done():
		return nil, tool.Wrap(ctx.Err(), tool.CodeBackendUnavailable, "mcp server %s: opening a session: %v", s.opts.Name, ctx.Err())
	}
	return k.l, k.err
}

// evictKeyed closes the least recently used keyed session while there
// are too many; s.keyed.mu is held.
func (s *Source) evictKeyed() {
	for len(s.keyed.links) > maxKeyedSessions {
		var oldest string
		var at uint64
		for key, k := range s.keyed.links {
			if oldest == "" || k.used < at {
				oldest, at = key, k.used
			}
		}
		k := s.keyed.links[oldest]
		delete(s.keyed.links, oldest)
		go func() {
			<-k.ready
			if k.l != nil {
				k.l.c.Close()
			}
		}()
	}
}

// forgetKeyed drops key's session if it is still k.
func (s *Source) forgetKeyed(key string, k *keyedLink) {
	s.keyed.mu.Lock()
	if s.keyed.links[key] == k {
		delete(s.keyed.links, key)
	}
	s.keyed.mu.Unlock()
}

// dropKeyed forgets and closes a keyed link whose connection failed; the
// next request for its key opens another.
func (s *Source) dropKeyed(l *link) {
	s.keyed.mu.Lock()
	if k, ok := s.keyed.links[l.key]; ok && k.l == l {
		delete(s.keyed.links, l.key)
	}
	s.keyed.mu.Unlock()
	l.c.Close()
}

// closeKeyed closes every keyed session (at Close, and when the shared
// link is replaced: a reconnected upstream may have forgotten them).
func (s *Source) closeKeyed() {
	s.keyed.mu.Lock()
	links := s.keyed.links
	s.keyed.links = nil
	s.keyed.mu.Unlock()
	for _, k := range links {
		go func() {
			<-k.ready
			if k.l != nil {
				k.l.c.Close()
			}
		}()
	}
}

// owned reports whether l is one caller's own session, whose unowned
// messages belong to that caller's call.
func (l *link) owned() bool { return l.key != "" && l.key != legacyKey }

// owners are the calls in flight on one link, so that what the upstream
// sends there outside a call's stream finds the call it belongs to.
type owners struct {
	mu    sync.Mutex
	seq   uint64
	calls map[uint64]*tool.Call
}

// enter records call as in flight on l until the returned func runs.
func (o *owners) enter(call *tool.Call) func() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.calls == nil {
		o.calls = map[uint64]*tool.Call{}
	}
	o.seq++
	n := o.seq
	o.calls[n] = call
	return func() {
		o.mu.Lock()
		delete(o.calls, n)
		o.mu.Unlock()
	}
}

// latest is the most recent call in flight, or nil.
func (o *owners) latest() *tool.Call {
	o.mu.Lock()
	defer o.mu.Unlock()
	var best uint64
	var c *tool.Call
	for n, call := range o.calls {
		if n > best {
			best, c = n, call
		}
	}
	return c
}
