package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/internal/rawjson"
	mcpsrc "github.com/capgate/capgate/sources/mcp"
)

// Errors mcp-go answers for capgate, put right. mcp-go v1.2.1 turns a
// handler's error into -32603 with the error's text, and answers a
// resources/read of a URI nothing serves without the URI. capgate wants an
// upstream's JSON-RPC error to reach the caller as the upstream gave it
// (code, message and data, hardened by the source; as the fast call writes
// it, rpcerror.go) and a resource not found to name its URI in data.uri
// (SEP-2164). mcp-go has no way to say either, so a request that may need
// it gets a response writer that does: a handler records the upstream's
// error in the request's context (passUpstream), and the writer replaces
// the error answer mcp-go writes for the request's id, as JSON or as the
// SSE event it is. Everything else it passes on as written.

type errorPatchKey struct{}

// errorPatch is the response writer of one POSTed request mcp-go answers.
type errorPatch struct {
	w   http.ResponseWriter
	id  []byte // the request's id, compact
	uri string // resources/read: the URI read
	// modern: a stateless request, whose status follows its error.
	modern bool
	// upstream is the upstream's error a handler recorded for the answer.
	upstream atomic.Pointer[mcpsrc.RPCError]
	// task is the CreateTaskResult a tools/call became (tasks.go), which
	// answers in place of the error mcp-go makes of it.
	task atomic.Pointer[json.RawMessage]
	// held is a JSON answer's status, held back until its body is seen
	// (the status follows the error); 0: none held. mcp-go writes under a
	// lock of its own, so held is never written by two at once.
	held int
	// queued counts the notifications capgate handed mcp-go for this
	// answer, written the SSE events written, and wrote is signalled on
	// each (see settle).
	queued, written atomic.Int64
	wrote           chan struct{}
	// streamed: the answer is a streamed call's (streamcall.go), whose
	// own forwarder puts what was queued on its stream (runStreamed).
	streamed bool
}

// patchedMethods are the methods whose errors may be an upstream's or a
// resource not found.
var patchedMethods = map[string]bool{`"tools/call"`: true, `"resources/read"`: true, `"prompts/get"`: true}

var uriName = []string{"uri"}

// newErrorPatch returns the writer for the request p is, and r carrying
// it, when p is a request whose errors it may put right; else nil.
func newErrorPatch(w http.ResponseWriter, r *http.Request, p *posted) (*errorPatch, *http.Request) {
	top, ok := p.members()
	if !ok || !patchedMethods[string(top[2])] || !present(top[1]) {
		return nil, r
	}
	var id bytes.Buffer
	if json.Compact(&id, top[1]) != nil {
		return nil, r
	}
	e := &errorPatch{w: w, id: id.Bytes(), modern: r.Header.Get(mcp.HeaderProtocolVersion) == modernProtocol, wrote: make(chan struct{}, 1)}
	if string(top[2]) == `"resources/read"` {
		var v [1][]byte
		if rawjson.Pick(top[3], uriName, v[:]) && v[0] != nil {
			json.Unmarshal(v[0], &e.uri)
		}
	}
	return e, r.WithContext(context.WithValue(r.Context(), errorPatchKey{}, e))
}

// passUpstream records err for the request ctx serves when it is an
// upstream's JSON-RPC error and the request's answer can carry it, and
// says whether it did: then the handler returns err as its error.
func passUpstream(ctx context.Context, err error) bool {
	var re *mcpsrc.RPCError
	e, _ := ctx.Value(errorPatchKey{}).(*errorPatch)
	if e == nil || err == nil || !errors.As(err, &re) {
		return false
	}
	e.upstream.Store(re)
	return true
}

func (e *errorPatch) Header() http.Header { return e.w.Header() }

// Unwrap gives http.ResponseController (mcp-go's write deadlines) the
// writer beneath.
func (e *errorPatch) Unwrap() http.ResponseWriter { return e.w }

func (e *errorPatch) WriteHeader(status int) {
	if isJSONType(e.w.Header().Get("Content-Type")) {
		e.held = status
		return
	}
	e.w.WriteHeader(status)
}

func (e *errorPatch) Write(p []byte) (int, error) {
	if out, status, ok := e.patch(p); ok {
		if e.held != 0 && status != 0 {
			e.held = status
		}
		e.release()
		_, err := e.w.Write(out)
		return len(p), err
	}
	e.release()
	n, err := e.w.Write(p)
	if bytes.HasPrefix(p, ssePrefix) {
		e.sent()
	}
	return n, err
}

// sent counts one notification written for the answer.
func (e *errorPatch) sent() {
	e.written.Add(1)
	select {
	case e.wrote <- struct{}{}:
	default:
	}
}

// mcp-go v1.2.1 loses a notification of a stateless request now and then:
// its forwarder takes it off the session's channel, and when the handler
// returns before the forwarder has written it, the response path (which
// drains the channel itself) writes the result and the forwarder, seeing
// the request done, drops what it holds. So before a call's handler
// returns, it waits until every notification capgate queued for the
// answer has been written (settle).
//
// A stateless request's session is its own, and so is a streamed call's:
// its forwarder writes all that was queued, unless the request ends
// first, so the wait is bounded by the request alone (and on a streamed
// call, an input request the call makes of its client follows what was
// sent before it). A 2025-11-25 session's queue is shared with its
// standalone stream and its other requests, which may take some of them:
// there (a tools/call mcp-go serves, not streamCall) the wait is bounded
// by settleLimit.
const settleLimit = 2 * time.Second

// queuedFor counts one notification queued for the answer ctx serves.
func queuedFor(ctx context.Context) {
	if e, _ := ctx.Value(errorPatchKey{}).(*errorPatch); e != nil {
		e.queued.Add(1)
	}
}

// settle waits until what was queued for the answer ctx serves is
// written, or ctx ends (on a session's shared queue: or settleLimit passes).
func settle(ctx context.Context) {
	e, _ := ctx.Value(errorPatchKey{}).(*errorPatch)
	if e == nil || e.written.Load() >= e.queued.Load() {
		return
	}
	var limit <-chan time.Time
	if !e.modern && !e.streamed {
		t := time.NewTimer(settleLimit)
		defer t.Stop()
		limit = t.C
	}
	for e.written.Load() < e.queued.Load() {
		select {
		case <-e.wrote:
		case <-ctx.Done():
			return
		case <-limit:
			return
		}
	}
}

func (e *errorPatch) Flush() {
	e.release()
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}

// release writes a held status.
func (e *errorPatch) release() {
	if e.held != 0 {
		e.w.WriteHeader(e.held)
		e.held = 0
	}
}

var ssePrefix = []byte("event: message\ndata: ")

// sseMessage is data (one JSON message) as the SSE event mcp-go writes.
func sseMessage(data []byte) []byte {
	ev := make([]byte, 0, len(ssePrefix)+len(data)+2)
	return append(append(append(ev, ssePrefix...), data...), "\n\n"...)
}

// patch returns what to write instead of p, and with what status (0: as
// mcp-go chose), when p is the error answering the request and capgate
// has better; ok is false otherwise.
func (e *errorPatch) patch(p []byte) (out []byte, status int, ok bool) {
	if !bytes.Contains(p, []byte(`"error"`)) {
		return nil, 0, false
	}
	body, sse := bytes.CutPrefix(p, ssePrefix)
	if sse {
		body = bytes.TrimSuffix(body, []byte("\n\n"))
	}
	var msg struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code    int             `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	var id bytes.Buffer
	if json.Unmarshal(body, &msg) != nil || msg.Error == nil || json.Compact(&id, msg.ID) != nil || !bytes.Equal(id.Bytes(), e.id) {
		return nil, 0, false
	}
	type details struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data,omitempty"`
	}
	if t := e.task.Load(); t != nil {
		b, err := json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Result  json.RawMessage `json:"result"`
		}{"2.0", e.id, *t})
		if err != nil {
			return nil, 0, false
		}
		if sse {
			return append(append(append([]byte(nil), ssePrefix...), b...), "\n\n"...), http.StatusOK, true
		}
		return append(b, '\n'), http.StatusOK, true
	}
	var d details
	switch re := e.upstream.Load(); {
	case re != nil:
		d, status = details{re.Code, re.Message, re.Data}, upstreamStatus(re, e.modern)
	case e.uri != "" && len(msg.Error.Data) == 0 && strings.Contains(msg.Error.Message, mcpserver.ErrResourceNotFound.Error()):
		d = details{msg.Error.Code, msg.Error.Message, map[string]string{"uri": e.uri}}
	default:
		return nil, 0, false
	}
	b, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   details         `json:"error"`
	}{"2.0", e.id, d})
	if err != nil {
		return nil, 0, false
	}
	if sse {
		return append(append(append([]byte(nil), ssePrefix...), b...), "\n\n"...), status, true
	}
	return append(b, '\n'), status, true
}

// upstreamFailure is how a call that failed with err answers the request
// ctx serves: an upstream's JSON-RPC error as that error where the answer
// can carry it (passUpstream) or the request is a forwarded continuation
// (the forwarding replica's answer carries it, internal.go), any other
// upstream error as a tool result; an error of capgate's stays one.
func upstreamFailure(ctx context.Context, err error) (*mcp.CallToolResult, error) {
	if isUpstreamError(err) && !isForwarded(ctx) && !passUpstream(ctx, err) {
		return mcpconv.Denial(err), nil
	}
	return nil, err
}

// isUpstreamError says whether err is an upstream's JSON-RPC error.
func isUpstreamError(err error) bool {
	var re *mcpsrc.RPCError
	return err != nil && errors.As(err, &re)
}
