package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/tool"
)

// The streamed call: a tools/call in a 2025-11-25 (or 2025-06-18) session
// that the fast call does not take (it has a progress token, its client
// can be asked things or asked for log messages) gets a response stream
// capgate writes itself. mcp-go v1.2.1 feeds a POST's stream and the
// session's standalone GET stream from one notification queue, so a call's
// progress could leave on the GET stream, after the result. Here mcp-go
// still dispatches the message (MCPServer.HandleMessage: hooks, filters,
// the bridge of input requests to server-to-client requests), but in a
// session of the call's own (callSession), whose notifications and
// requests to the client go on this call's stream and nowhere else, each
// before the result. Notifications about nothing in particular (list
// changes) still reach the session itself, so its GET stream. The stream
// starts with a priming event and carries event ids (callstream.go).

// streamSession is what mcp-go's streamable-HTTP session offers that a
// call's session passes on.
type streamSession interface {
	mcpserver.SessionWithLogging
	mcpserver.SessionWithClientInfo
	mcpserver.SessionWithTools
	mcpserver.SessionWithResources
	mcpserver.SessionWithResourceTemplates
	mcpserver.SessionWithProtocolVersion
}

// callSession is the session a streamed call is served in: the client's
// session, but with the call's own notification channel, and the
// client's requests written to the call's stream.
type callSession struct {
	streamSession
	notes  chan mcp.JSONRPCNotification
	stream *callStream
	asks   *clientAsks
}

func (c *callSession) NotificationChannel() chan<- mcp.JSONRPCNotification { return c.notes }

func (c *callSession) RequestSampling(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	res, err := askClient[mcp.CreateMessageResult](ctx, c, mcp.MethodSamplingCreateMessage, req.CreateMessageParams)
	if err == nil {
		if res.Content, err = mcp.ParseSamplingContent(res.Content); err != nil {
			return nil, fmt.Errorf("the client's answer to %s: %w", mcp.MethodSamplingCreateMessage, err)
		}
	}
	return res, err
}

func (c *callSession) RequestElicitation(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	return askClient[mcp.ElicitationResult](ctx, c, mcp.MethodElicitationCreate, req.Params)
}

func (c *callSession) ListRoots(ctx context.Context, _ mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	return askClient[mcp.ListRootsResult](ctx, c, mcp.MethodListRoots, nil)
}

// askClient asks the call's client one thing and decodes its answer.
func askClient[T any](ctx context.Context, c *callSession, method mcp.MCPMethod, params any) (*T, error) {
	b, err := c.request(ctx, method, params)
	if err != nil {
		return nil, err
	}
	var res T
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("the client's answer to %s: %w", method, err)
	}
	return &res, nil
}

// request asks the client one thing on the call's stream and waits for
// its answer, which it POSTs (clientAsks.answer).
func (c *callSession) request(ctx context.Context, method mcp.MCPMethod, params any) (json.RawMessage, error) {
	id := c.stream.id + askSep + strconv.FormatUint(c.asks.seq.Add(1), 10)
	key := askKey{session: c.SessionID(), id: `"` + id + `"`}
	reply := c.asks.add(key)
	defer c.asks.remove(key)
	c.stream.add(mcp.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(id),
		Request: mcp.Request{Method: string(method)}, Params: params})
	select {
	case a := <-reply:
		if a.err != nil {
			return nil, fmt.Errorf("%s error %d: %s", method, a.err.Code, a.err.Message)
		}
		return a.result, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// clientAsks are the requests streamed calls made of their clients and
// await answers to, by session and JSON-RPC id.
type clientAsks struct {
	mu      sync.Mutex
	pending map[askKey]chan askAnswer
	n       atomic.Int64 // len(pending), read without the lock
	seq     atomic.Uint64
}

type askKey struct{ session, id string }

type askAnswer struct {
	result json.RawMessage
	err    *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
}

func (a *clientAsks) add(k askKey) chan askAnswer {
	ch := make(chan askAnswer, 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		a.pending = map[askKey]chan askAnswer{}
	}
	a.pending[k] = ch
	a.n.Store(int64(len(a.pending)))
	return ch
}

func (a *clientAsks) remove(k askKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, k)
	a.n.Store(int64(len(a.pending)))
}

var answerNames = []string{"id", "method", "result", "error"}

// askSep separates a request's stream id from its number in the ids of
// capgate's requests to its clients ("<stream>~<n>"): the stream id names
// the replica awaiting the answer (callstream.go), and has no '~'.
const askSep = "~"

// answerAsk takes a client's POSTed answer to a streamed call's request,
// and says whether it did: delivered here (then it has answered 202), or
// forwarded to the replica whose call awaits it (then it has relayed that
// replica's answer).
func (m *MCP) answerAsk(w http.ResponseWriter, r *http.Request, body []byte) bool {
	session := r.Header.Get(mcpserver.HeaderKeySessionID)
	if m.asks.n.Load() > 0 && m.asks.deliver(session, body) {
		w.WriteHeader(http.StatusAccepted)
		return true
	}
	if r.Header.Get(mcp.HeaderProtocolVersion) == modernProtocol || // no requests on 2026-07-28 streams
		!bytes.Contains(body, []byte(`"`+streamPrefix)) { // not an answer to capgate
		return false
	}
	var v [4][]byte
	if !rawjson.Pick(body, answerNames, v[:]) || v[1] != nil || (v[2] == nil && v[3] == nil) {
		return false
	}
	id, ok := plainString(v[0])
	if !ok {
		return false
	}
	stream, _, ok := strings.Cut(id, askSep)
	if !ok {
		return false
	}
	replica, url, ok := m.streams.holder(stream, session)
	if !ok || m.streams.here(replica, url) {
		return false // not capgate's, or no call here awaits it any more
	}
	m.forwardAnswer(w, r, replica, url, session, id, body)
	return true
}

// deliver hands a client's answer, body, in session to the call here
// awaiting it, and says whether one did.
func (a *clientAsks) deliver(session string, body []byte) bool {
	var v [4][]byte
	if !rawjson.Pick(body, answerNames, v[:]) || v[1] != nil || v[0] == nil || (v[2] == nil && v[3] == nil) {
		return false
	}
	k := askKey{session: session, id: string(v[0])}
	a.mu.Lock()
	ch, ok := a.pending[k]
	delete(a.pending, k)
	a.n.Store(int64(len(a.pending)))
	a.mu.Unlock()
	if !ok {
		return false
	}
	var ans askAnswer
	if v[3] != nil {
		if err := json.Unmarshal(v[3], &ans.err); err != nil || ans.err == nil {
			ans.err = &struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}{Code: mcp.INTERNAL_ERROR, Message: "the client answered with an unreadable error"}
		}
	} else {
		ans.result = append(json.RawMessage(nil), v[2]...)
	}
	ch <- ans
	return true
}

// acceptsSSE says whether an Accept header takes an event stream.
func acceptsSSE(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(part, ";")
		if mt = strings.TrimSpace(mt); mt == "text/event-stream" || mt == "*/*" || mt == "text/*" {
			return true
		}
	}
	return false
}

// streamCall serves r as a streamed call when it is one, and says whether
// it did: a POSTed tools/call (with an id) in a live session of the
// version its header names, whose client accepts an event stream.
func (m *MCP) streamCall(w http.ResponseWriter, r *http.Request, body *posted) bool {
	h := r.Header
	version := h.Get(mcp.HeaderProtocolVersion)
	if _, ok := sessionProtocols[version]; !ok || h.Get(mcp.HeaderLastEventID) != "" ||
		!isJSONType(h.Get("Content-Type")) || !acceptsSSE(h.Get("Accept")) {
		return false
	}
	// A body mcp-go would read as another era's (its _meta names a
	// protocol) is mcp-go's to refuse.
	var msg fastCallMessage
	if !msg.read(body) || string(msg.method) != `"tools/call"` || !present(msg.id) || msg.protocolVersion != nil {
		return false
	}
	sess := m.live.get(h.Get(mcpserver.HeaderKeySessionID))
	if sess == nil || sess.ProtocolVersion() != version {
		return false
	}
	full, ok := sess.sessionInfo.(streamSession)
	if !ok {
		return false
	}
	// The call outlives its connection: a client that lost it resumes
	// (callstream.go). It ends with its work, a notifications/cancelled,
	// or a client that does not come back.
	// An upstream's JSON-RPC error reaches the client as the upstream gave
	// it, as on mcp-go's own path (passerror.go).
	patch, pr := newErrorPatch(w, r, body)
	if patch != nil {
		patch.streamed = true
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(pr.Context()))
	ctx, untrack := sess.track(ctx, msg.id)
	polls := version == "2025-11-25" // SSE polling came with SEP-1699
	s := m.streams.open(sess.id, cancel, polls)
	if s.polls {
		// An upstream that closes the call's stream with a retry has this
		// stream closed so too, and resumes when its client comes back.
		ctx = tool.WithPause(ctx, s.pause)
	}
	call := &callSession{streamSession: full, notes: make(chan mcp.JSONRPCNotification, 256), stream: s, asks: &m.asks}
	ctx = mcpserver.WithSupportedProtocolVersions(m.srv.WithContext(ctx, call), mcpserver.FilterSupportedVersions(m.stream))
	go m.runStreamed(ctx, call, body.body, patch, func() { untrack(); cancel() })
	m.streamedCalls.Add(1)

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if polls { // priming events came with SEP-1699
		w.Write(s.primingEvent())
	}
	_ = http.NewResponseController(w).Flush() // the client knows it may resume from here
	s.serve(r.Context(), w, 0, &m.streams)
	return true
}

// runStreamed runs the call through mcp-go in its own session, passing
// its notifications to its stream as they come and, after the last, its
// response.
func (m *MCP) runStreamed(ctx context.Context, call *callSession, body []byte, patch *errorPatch, end func()) {
	defer end()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case n := <-call.notes:
				call.stream.add(n)
				if patch != nil {
					patch.sent() // what waits for it (settle) may go on
				}
			case <-stop:
				return
			}
		}
	}()
	var resp mcp.JSONRPCMessage
	func() {
		defer func() {
			if p := recover(); p != nil {
				slog.Default().Error("streamed tools/call panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				resp = mcp.NewJSONRPCError(requestID(body), mcp.INTERNAL_ERROR, "internal error: the call failed inside capgate", nil)
			}
		}()
		resp = m.srv.HandleMessage(ctx, body)
	}()
	close(stop)
	<-stopped
	// Whatever the call sent before its response is queued: it goes first.
	for {
		select {
		case n := <-call.notes:
			call.stream.add(n)
			continue
		default:
		}
		break
	}
	call.stream.finish(patched(resp, patch))
}

// patched is resp with the upstream's error patch has for it, if any.
func patched(resp mcp.JSONRPCMessage, patch *errorPatch) any {
	if patch == nil {
		return resp
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return resp
	}
	if out, _, ok := patch.patch(b); ok {
		return json.RawMessage(bytes.TrimSpace(out))
	}
	return resp
}

// requestID is the id of a JSON-RPC request body, for an error answer.
func requestID(body []byte) mcp.RequestId {
	var v struct {
		ID mcp.RequestId `json:"id"`
	}
	_ = json.Unmarshal(bytes.TrimSpace(body), &v)
	return v.ID
}
