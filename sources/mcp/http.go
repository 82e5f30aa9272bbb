package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/paramheader"
	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
)

// A tools/call to a streamable-HTTP upstream is posted here rather than
// through mcp-go's client: the request is written straight from the raw
// input, the result is read without decoding its content blocks, and
// everything the upstream sends on the call's stream (progress, log
// messages, sampling and elicitation requests) belongs to that call, so
// it is relayed to that caller and no other.

// callHTTP posts tools/call on l's session and reads the answer; on the
// stateless protocol it answers the upstream's input rounds (modern.go).
func (s *Source) callHTTP(ctx context.Context, l *link, call tool.Call, args json.RawMessage) (*tool.Result, error) {
	id := "capgate-" + strconv.FormatInt(s.seq.Add(1), 10)
	body := make([]byte, 0, 128+len(args))
	body = append(body, `{"jsonrpc":"2.0","id":"`...)
	body = append(body, id...)
	body = append(body, `","method":"tools/call","params":{"name":`...)
	body = rawjson.AppendString(body, call.Tool.Name)
	body = append(body, `,"arguments":`...)
	body = append(body, args...)
	tp, ts, traced := telemetry.TraceParent(ctx)
	modern := l.modern()
	if call.Tasks && offersTasks(l) {
		ctx = withTasks(ctx) // the upstream may answer with a task
	}
	metaAt := -1
	if call.Progress != nil || traced || modern {
		body = append(body, `,"_meta":`...)
		metaAt = len(body)
		body = append(body, '{')
		if modern {
			body = append(body, metaFor(ctx, call.Ask != nil)...)
		}
		if call.Progress != nil {
			// Progress may also come on the standalone stream (mcp-go servers
			// share one queue between it and the call's), found by token;
			// the merge keeps it going forward (progress.go).
			m := newProgressMerge(call.Progress)
			call.Progress = m.fromCall
			s.progress.Store(id, m.fromStandalone)
			defer func() {
				s.progress.Delete(id)
				if n := m.dropped(); n > 0 {
					s.opts.Logger.Debug("dropped progress the upstream's other stream overtook", "server", s.opts.Name,
						"tool", call.Tool.Name, "dropped", n)
				}
			}()
			if modern {
				body = append(body, ',')
			}
			body = append(body, `"progressToken":"`...)
			body = append(body, id...)
			body = append(body, '"')
		}
		body = appendTraceMeta(body, tp, ts, call.Progress != nil || modern)
		body = append(body, '}')
	}
	var meta []byte
	if metaAt >= 0 {
		meta = body[metaAt:]
	}
	if answers := tool.Answers(ctx); modern && answers != nil {
		body = append(body, `,"inputResponses":`...)
		body = append(body, answers...)
	}
	body = append(body, "}}"...)
	if modern {
		// The tool's x-mcp-header arguments travel in Mcp-Param-* too
		// (SEP-2243), for the upstream's balancers; it checks them.
		mirrored := paramheader.Mirror(call.Tool.InputSchema, args)
		if mirrored == nil && l.post != nil && ctx.Value(headersKey{}) == nil {
			// No hook headers and nothing mirrored: the whole head of the
			// request is the same for every call of the tool.
			ctx = context.WithValue(ctx, callHeadKey{}, s.callHead(l, call.Tool.Name))
		} else {
			h := s.toolsCallHeaders(call.Tool.Name)
			if mirrored != nil {
				h = h.Clone()
				for k, v := range mirrored {
					h.Set(k, v)
				}
			}
			ctx = withMoreHeaders(ctx, h)
		}
	}

	for round := 0; ; round++ {
		raw, err := s.postCall(ctx, l, id, call, body)
		if err != nil {
			return nil, err
		}
		if ir, ok := needsInput(raw); ok && modern {
			if round >= maxInputRounds {
				return nil, tool.Errorf(tool.CodeInvalidOutput, "mcp server %s: tools/call %s asked for input more than %d times", s.opts.Name, call.Tool.Name, maxInputRounds)
			}
			answers, err := s.fulfil(ctx, call, ir)
			if err != nil {
				return nil, err
			}
			if body, err = retryBody(id, call.Tool.Name, args, meta, answers, ir.RequestState); err != nil {
				return nil, tool.Wrap(err, tool.CodeInternal, "mcp server %s: tools/call %s: %v", s.opts.Name, call.Tool.Name, err)
			}
			continue
		}
		if task, ok := taskResult(raw); ok && modern {
			if ctx.Value(tasksKey{}) == nil {
				return nil, tool.Errorf(tool.CodeInvalidOutput, "mcp server %s: tools/call %s: answered with a task, which this call did not declare it takes", s.opts.Name, call.Tool.Name)
			}
			return &tool.Result{Content: []json.RawMessage{}, Task: task}, nil
		}
		if out, ok := readResult(raw); ok {
			return out, nil
		}
		out, rpcErr, err := decodeResult(raw)
		switch {
		case err != nil:
			return nil, tool.Wrap(err, tool.CodeInvalidOutput, "mcp server %s: tools/call %s: the response is not JSON-RPC: %v", s.opts.Name, call.Tool.Name, err)
		case rpcErr != nil:
			return nil, s.rpcError("tools/call "+call.Tool.Name, rpcErr.Code, rpcErr.Message, rpcErr.Data)
		case out == nil:
			return nil, tool.Errorf(tool.CodeInvalidOutput, "mcp server %s: tools/call %s: the response has neither result nor error", s.opts.Name, call.Tool.Name)
		}
		return out, nil
	}
}

// toolsCallHeaders are the standard headers of a tools/call of name; the
// returned header is shared and must not be changed.
func toolsCallHeaders(name string) http.Header {
	return standardHeaders("tools/call", json.RawMessage(`{"name":`+strconv.Quote(name)+`}`))
}

// toolsCallHeaders is toolsCallHeaders, as made when the tool was listed.
func (s *Source) toolsCallHeaders(name string) http.Header {
	if heads := s.callHeads.Load(); heads != nil {
		if h, ok := (*heads)[name]; ok {
			return h
		}
	}
	return toolsCallHeaders(name)
}

// callHeadKey holds, for a call's requests, its *callHead.
type callHeadKey struct{}

// callHead is what withMoreHeaders would add for a tools/call of one tool
// (std, its standard headers) and, over l's POST header, the whole header
// newRequest would then build (full): made once per link and tool (at
// most one per tool listed), shared, changed by no one.
type callHead struct{ full, std http.Header }

// callHead is l's callHead for a tools/call of name.
func (s *Source) callHead(l *link, name string) *callHead {
	if h, ok := l.callHeads.Load(name); ok {
		return h.(*callHead)
	}
	h := &callHead{full: l.post.Header.Clone(), std: s.toolsCallHeaders(name)}
	for k, v := range h.std {
		h.full[http.CanonicalHeaderKey(k)] = v
	}
	l.callHeads.Store(name, h)
	return h
}

// postCall posts one tools/call body and returns the response to id,
// having relayed what came before it.
func (s *Source) postCall(ctx context.Context, l *link, id string, call tool.Call, body []byte) (json.RawMessage, error) {
	ctx, resp, err := s.postAuthorized(ctx, l, body)
	if err != nil {
		return nil, s.httpFailed(ctx, l, id, call, err)
	}
	defer resp.Body.Close()
	var raw json.RawMessage
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err = s.readStream(ctx, l, resp.Body, id, call)
	} else {
		raw, err = readBody(resp, s.opts.MaxMessage)
	}
	if asTooLarge(err) {
		// The upstream may still be writing it: tell it to stop.
		go s.cancelUpstream(l, id, err)
		return nil, s.tooLarge("tools/call "+call.Tool.Name, err)
	}
	if err != nil {
		return nil, s.httpFailed(ctx, l, id, call, err)
	}
	return raw, nil
}

// decodeResult reads a tools/call response with encoding/json: the
// result, or the error, or neither.
func decodeResult(raw []byte) (*tool.Result, *mcpgo.JSONRPCErrorDetails, error) {
	var msg struct {
		Result *struct {
			Content           []json.RawMessage `json:"content"`
			StructuredContent json.RawMessage   `json:"structuredContent"`
			IsError           bool              `json:"isError"`
		} `json:"result"`
		Error *mcpgo.JSONRPCErrorDetails `json:"error"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		return nil, nil, err
	}
	if msg.Error != nil || msg.Result == nil {
		return nil, msg.Error, nil
	}
	out := &tool.Result{Content: msg.Result.Content, IsError: msg.Result.IsError}
	if out.Content == nil {
		out.Content = []json.RawMessage{}
	}
	if st := msg.Result.StructuredContent; len(st) > 0 && string(st) != "null" {
		out.Structured = st
	}
	return out, nil, nil
}

var (
	responseNames = []string{"result", "error"}
	resultNames   = []string{"content", "structuredContent", "isError"}
)

// readResult reads a successful tools/call response without decoding it,
// as decodeResult would: its content blocks and structured content are
// slices of raw. It says no to anything else (an error, an odd document),
// which decodeResult reads.
func readResult(raw []byte) (*tool.Result, bool) {
	var msg [2][]byte
	var res [3][]byte
	if !rawjson.Pick(raw, responseNames, msg[:]) || msg[1] != nil || msg[0] == nil ||
		!rawjson.Pick(msg[0], resultNames, res[:]) {
		return nil, false
	}
	out := &tool.Result{Content: []json.RawMessage{}}
	switch string(res[2]) {
	case "", "null", "false":
	case "true":
		out.IsError = true
	default:
		return nil, false
	}
	if c := res[0]; c != nil && string(c) != "null" &&
		!rawjson.Elements(c, func(v []byte) { out.Content = append(out.Content, v) }) {
		return nil, false
	}
	if st := res[1]; st != nil && string(st) != "null" {
		out.Structured = st
	}
	return out, true
}

// readBody reads a JSON answer whole, at once when its length is known;
// one longer than max is a *TooLargeError, and no more than max is read.
func readBody(resp *http.Response, max int64) ([]byte, error) {
	if n := resp.ContentLength; n > max {
		return nil, &TooLargeError{Limit: max}
	} else if n > 0 {
		b := make([]byte, n)
		_, err := io.ReadFull(resp.Body, b)
		return b, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if int64(len(b)) > max {
		return nil, &TooLargeError{Limit: max}
	}
	return b, err
}

// httpError is a non-2xx answer.
type httpError struct {
	status int
	body   string // its start, for messages
	raw    []byte // the body, up to maxErrorBody
}

// maxErrorBody bounds what is read of a non-2xx answer: enough for a
// JSON-RPC error and its data.
const maxErrorBody = 64 << 10

// refusal is the JSON-RPC error an upstream answered with in a 4xx
// response (the stateless protocol answers -32021, -32020, -32602 and
// others with 400), passed on as an RPCError that keeps the status; nil
// when err is not that.
func (s *Source) refusal(what string, err error) error {
	var he *httpError
	if !errors.As(err, &he) || he.status/100 != 4 || he.status == http.StatusUnauthorized {
		return nil
	}
	var msg struct {
		Error *mcpgo.JSONRPCErrorDetails `json:"error"`
	}
	if json.Unmarshal(he.raw, &msg) != nil || msg.Error == nil {
		return nil
	}
	out := s.rpcError(what, msg.Error.Code, msg.Error.Message, msg.Error.Data)
	var re *RPCError
	if errors.As(out, &re) {
		re.Status = he.status
	}
	return out
}

func (e *httpError) Error() string {
	if e.body == "" {
		return "HTTP " + strconv.Itoa(e.status)
	}
	return fmt.Sprintf("HTTP %d: %s", e.status, e.body)
}

// isUnauthorized says whether err is the upstream's 401.
func isUnauthorized(err error) bool {
	he, ok := errors.AsType[*httpError](err)
	return ok && he.status == http.StatusUnauthorized
}

// httpFailed sorts a failed call: cancelled by the caller (the upstream is
// told), the session gone (reconnect), or the upstream unreachable.
func (s *Source) httpFailed(ctx context.Context, l *link, id string, call tool.Call, err error) error {
	if ctx.Err() != nil {
		go s.cancelUpstream(l, id, ctx.Err())
		return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: tools/call %s: %v", s.opts.Name, call.Tool.Name, ctx.Err())
	}
	var he *httpError
	if errors.As(err, &he) && he.status == http.StatusNotFound && l.session != "" {
		s.drop(l, errors.New("the upstream ended its session"))
		return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: tools/call %s: the upstream ended its session; reconnecting", s.opts.Name, call.Tool.Name)
	}
	if re := s.refusal("tools/call "+call.Tool.Name, err); re != nil {
		return re
	}
	if errors.As(err, &he) {
		return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: tools/call %s: %v", s.opts.Name, call.Tool.Name, err)
	}
	var te *tool.Error
	if errors.As(err, &te) {
		return err
	}
	s.drop(l, err)
	return tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: tools/call %s failed: %v", s.opts.Name, call.Tool.Name, err)
}

// cancelUpstream tells the upstream that the caller gave up on request id.
func (s *Source) cancelUpstream(l *link, id string, why error) {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": id, "reason": why.Error()}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := s.post(ctx, l, b, ""); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// postAuthorized posts body as post does; when the upstream refuses the
// caller's token, the Unauthorized hook refreshes it once, and the second
// time says what the caller must do (its error). It returns ctx with the
// headers the post went with.
func (s *Source) postAuthorized(ctx context.Context, l *link, body []byte) (context.Context, *http.Response, error) {
	resp, err := s.post(ctx, l, body, "")
	for again := false; isUnauthorized(err); again = true {
		var hookErr error
		var ok bool
		if ctx, ok, hookErr = s.unauthorized(ctx, again); !ok {
			break
		}
		if hookErr != nil {
			return ctx, nil, hookErr
		}
		resp, err = s.post(ctx, l, body, "")
	}
	return ctx, resp, err
}

// post sends one JSON-RPC message on l's session; a GET with Last-Event-ID
// when resume is set. A non-2xx answer is an *httpError.
func (s *Source) post(ctx context.Context, l *link, body []byte, resume string) (*http.Response, error) {
	req, err := s.newRequest(ctx, l, body, resume)
	if err != nil {
		return nil, err
	}
	// The transport itself, sparing http.Client's copies of the request;
	// the client only follows a redirect, which an upstream rarely sends.
	resp, err := pooledTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 3 && resp.Header.Get("Location") != "" {
		resp.Body.Close()
		if req, err = s.newRequest(ctx, l, body, resume); err != nil {
			return nil, err
		}
		if resp, err = pooledClient.Do(req); err != nil {
			return nil, err
		}
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		short := b[:min(len(b), 512)]
		return nil, &httpError{status: resp.StatusCode, body: strings.TrimSpace(string(short)), raw: b}
	}
	return resp, nil
}

// newRequest is the request post sends; with a nil body, the head of one.
// A POST copies the link's head when it has one (see link.post).
func (s *Source) newRequest(ctx context.Context, l *link, body []byte, resume string) (*http.Request, error) {
	if resume == "" && l.post != nil && len(body) > 0 {
		req := l.post.WithContext(ctx)
		if head, ok := ctx.Value(callHeadKey{}).(*callHead); ok {
			req.Header = head.full
		}
		if extra := ctx.Value(headersKey{}); extra != nil {
			// A hook's headers (after a refusal, see postAuthorized) go
			// over the rest.
			req.Header = req.Header.Clone()
			addHeaders(ctx, req.Header)
		}
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.Body, _ = req.GetBody()
		req.ContentLength = int64(len(body))
		return traced(req), nil
	}
	method, rd := http.MethodPost, io.Reader(nil)
	if body != nil {
		rd = bytes.NewReader(body)
	}
	if resume != "" {
		method, rd = http.MethodGet, nil
	}
	req, err := http.NewRequestWithContext(ctx, method, s.opts.URL, rd)
	if err != nil {
		return nil, err
	}
	h := req.Header
	for k, v := range s.opts.Headers {
		h.Set(k, v)
	}
	if resume != "" {
		h["Accept"] = []string{"text/event-stream"}
		h["Last-Event-Id"] = []string{resume}
	} else {
		h["Content-Type"] = []string{"application/json"}
		h["Accept"] = []string{"application/json, text/event-stream"}
	}
	if head, ok := ctx.Value(callHeadKey{}).(*callHead); ok {
		for k, v := range head.std {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	addHeaders(ctx, h)
	if l.session != "" {
		h["Mcp-Session-Id"] = []string{l.session}
	}
	if l.version != "" {
		h["Mcp-Protocol-Version"] = []string{l.version}
	}
	return traced(req), nil
}

// readStream reads the call's SSE stream until the response to id,
// relaying what comes before it. A stream the upstream ends early, having
// given event ids, is resumed with Last-Event-ID (2025-11-25 polling):
// when the caller comes back, if its stream could be closed the same way
// (tool.Pause), else after the upstream's retry. Either way at most once
// per close, so a caller cannot make capgate poll the upstream faster
// than it closes.
func (s *Source) readStream(ctx context.Context, l *link, body io.Reader, id string, call tool.Call) (json.RawMessage, error) {
	var (
		wg      sync.WaitGroup
		lastID  string
		retry   = time.Second
		resumes int
		resumed io.Closer // the open resumed stream; the caller closes the first
	)
	defer wg.Wait()
	defer func() {
		if resumed != nil {
			resumed.Close()
		}
	}()
	for {
		res, err := s.readEvents(ctx, l, body, id, call, &wg, &lastID, &retry)
		if res != nil || err != nil {
			return res, err
		}
		if lastID == "" || resumes >= 100 {
			return nil, errors.New("the upstream ended the stream before the response")
		}
		resumes++
		var back <-chan struct{} // nil: the caller is not asked to come back
		if pause := tool.PauseOf(ctx); pause != nil {
			back = pause(retry)
		}
		wait := time.NewTimer(retry)
		select {
		case <-wait.C:
		case <-back:
			wait.Stop()
		case <-ctx.Done():
			wait.Stop()
			return nil, ctx.Err()
		}
		resp, err := s.post(ctx, l, nil, lastID)
		if err != nil {
			return nil, err
		}
		if resumed != nil {
			resumed.Close()
		}
		resumed, body = resp.Body, resp.Body
	}
}

// readEvents reads one SSE stream; it returns the response to id, or nil
// when the stream ended without it.
func (s *Source) readEvents(ctx context.Context, l *link, body io.Reader, id string, call tool.Call,
	wg *sync.WaitGroup, lastID *string, retry *time.Duration) (json.RawMessage, error) {
	r := bufio.NewReaderSize(body, 16<<10)
	var data []byte
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line (an image, say): gather the rest.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.ReadSlice('\n')
				long = append(long, line...)
				if int64(len(long)) > s.opts.MaxMessage {
					return nil, &TooLargeError{Limit: s.opts.MaxMessage}
				}
			}
			line = long
		}
		if err != nil && len(line) == 0 {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if len(data) > 0 {
				if res := s.event(ctx, l, data, id, call, wg); res != nil {
					return res, nil
				}
				data = data[:0]
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, value...)
			if int64(len(data)) > s.opts.MaxMessage {
				return nil, &TooLargeError{Limit: s.opts.MaxMessage}
			}
		case "id":
			*lastID = string(value)
		case "retry":
			if ms, err := strconv.Atoi(string(value)); err == nil && ms >= 0 {
				*retry = max(time.Duration(ms)*time.Millisecond, 10*time.Millisecond)
			}
		}
	}
}

// event handles one message of the call's stream; it returns the message
// when it is the response to id.
func (s *Source) event(ctx context.Context, l *link, data []byte, id string, call tool.Call, wg *sync.WaitGroup) json.RawMessage {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		s.opts.Logger.Debug("ignoring an event that is not JSON-RPC", "server", s.opts.Name, "err", err)
		return nil
	}
	hasID := len(m.ID) > 0 && string(m.ID) != "null"
	switch {
	case m.Method == "" && hasID:
		if rid, err := strconv.Unquote(string(m.ID)); err == nil && rid == id {
			return bytes.Clone(data)
		}
	case m.Method != "" && hasID:
		// The upstream waits for this answer before it goes on, and it may
		// ask several things at once.
		reqID, params := json.RawMessage(bytes.Clone(m.ID)), json.RawMessage(bytes.Clone(m.Params))
		wg.Go(func() {
			res, rpcErr := answer(ctx, call, m.Method, params)
			msg := map[string]any{"jsonrpc": "2.0", "id": reqID}
			if rpcErr != nil {
				msg["error"] = rpcErr
			} else {
				msg["result"] = res
			}
			b, _ := json.Marshal(msg)
			resp, err := s.post(ctx, l, b, "")
			if err != nil {
				s.opts.Logger.Warn("could not answer the upstream's request", "server", s.opts.Name, "method", m.Method, "err", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	case m.Method != "" && ctx.Value(streamSinkKey{}) != nil:
		// A stream read for one listener (ListenTasks): its alone.
		ctx.Value(streamSinkKey{}).(streamSink)(m.Method, bytes.Clone(m.Params))
	case m.Method == "notifications/progress":
		if call.Progress != nil {
			var p struct {
				Progress float64 `json:"progress"`
				Total    float64 `json:"total"`
				Message  string  `json:"message"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				call.Progress(p.Progress, p.Total, p.Message)
			}
		}
	case m.Method == "notifications/message":
		if call.Log != nil {
			call.Log(bytes.Clone(m.Params))
		}
	case m.Method == "notifications/tools/list_changed":
		s.changed()
	case m.Method != "":
		s.notify(m.Method, bytes.Clone(m.Params))
	}
	return nil
}
