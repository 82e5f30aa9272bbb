package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/router"
	mcpsrc "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// An upstream call parked waiting for the client lives on the replica that
// holds it. Another replica that receives its continuation forwards it
// there: a POST to the holder's internalPath (its Options.AdvertiseURL,
// which the sealed state names), authenticated by a MAC under a key
// derived from the shared secret over a timestamp and the body. The
// holder refuses anything else with 403, before reading the body as more
// than bytes. The state was claimed by the replica that received it, so
// the holder does not claim it again; it only takes the job parked under
// exactly that state.
//
// A client's resume of a call's stream (callstream.go), or its answer to
// a request the call made of it (streamcall.go), that reaches a replica
// other than the one holding the stream goes the same way: the body names
// the session and the Last-Event-ID or the answer (the forwarding replica
// has checked the caller's claim on the session, and the stream id, which
// the request id carries, was sealed for it), the holder serves it as its
// own, and the forwarding replica relays its answer as it comes.
const (
	internalPath   = "/internal/continue"
	internalLabel  = "capgate internal call v1"
	internalHeader = "Capgate-Replica-Mac" // "<unix ms>.<hex MAC>"
	// internalSkew is how far a forwarded call's timestamp may be from
	// the holder's clock.
	internalSkew = 30 * time.Second
	// maxForwardedResult bounds the holder's answer a replica reads.
	maxForwardedResult = 64 << 20
	// resumeAnswer bounds the wait for the holder's answer to a forwarded
	// resume to begin (it begins at once: the stream follows).
	resumeAnswer = 10 * time.Second
)

// upstreamErrorHeader marks the holder's 502 that carries the upstream's
// JSON-RPC error (a forwardedError) rather than a failure of its own.
const upstreamErrorHeader = "Capgate-Upstream-Error"

// taskHeader marks a forwarded continuation's answer as the task the call
// became (the body its CreateTaskResult, owner already recorded).
const taskHeader = "Capgate-Task"

// forwardedError is an upstream's JSON-RPC error, as hardened by its
// source, on its way back to the forwarding replica.
type forwardedError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
	Status  int    `json:"status,omitempty"`
}

// continuation is a forwarded continuation: whose, the state, the
// answers; or, with Resume, a forwarded resume of a call's stream; or,
// with Answer, a client's answer to a request of a streamed call.
type continuation struct {
	Sub       string             `json:"sub,omitempty"`
	State     string             `json:"state,omitempty"`
	Responses mcp.InputResponses `json:"input_responses,omitempty"`
	Resume    *streamResume      `json:"resume,omitempty"`
	Answer    *clientAnswer      `json:"answer,omitempty"`
}

// clientAnswer is a client's answer (a JSON-RPC response) to a request a
// streamed call made of it, in its session.
type clientAnswer struct {
	Session string          `json:"session"`
	Body    json.RawMessage `json:"body"`
}

// streamResume is a client's resume of a call's stream: its session and
// its Last-Event-ID.
type streamResume struct {
	Session     string `json:"session"`
	LastEventID string `json:"last_event_id"`
}

// internalCalls is one replica's side of the forwarding.
type internalCalls struct {
	key    []byte
	client *http.Client
	// logger takes what went wrong reaching a replica: its address and the
	// transport's error, which the client, answered only with the
	// replica's id, is not shown.
	logger *slog.Logger
}

func newInternalCalls(secret []byte) *internalCalls {
	return &internalCalls{key: deriveKey(secret, internalLabel), client: &http.Client{}, logger: slog.New(slog.DiscardHandler)}
}

// mac is HMAC-SHA256(key, "<t>\n" || body), in hex.
func (ic *internalCalls) mac(t int64, body []byte) string {
	h := hmac.New(sha256.New, ic.key)
	fmt.Fprintf(h, "%d\n", t)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// verify says whether header authenticates body now.
func (ic *internalCalls) verify(header string, body []byte, now time.Time) bool {
	ts, mac, ok := strings.Cut(header, ".")
	t, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil {
		return false
	}
	if d := now.Sub(time.UnixMilli(t)); d > internalSkew || d < -internalSkew {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(ic.mac(t, body)))
}

type forwardedKey struct{}

// isForwarded says whether ctx is a forwarded continuation's: a 2026-07-28
// exchange, whose client may come back to any replica.
func isForwarded(ctx context.Context) bool { return ctx.Value(forwardedKey{}) != nil }

// forward sends the continuation of the call st names to the replica that
// holds it and returns that replica's answer.
func (m *MCP) forward(ctx context.Context, c *router.Caller, st *requestState, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	unavailable := func(format string, args ...any) (*mcp.CallToolResult, error) {
		return mcpconv.Denial(tool.Errorf(tool.CodeBackendUnavailable, "the call this requestState continues waits on replica %q, which "+format+"; call %s again",
			append(append([]any{st.Replica}, args...), req.Params.Name)...)), nil
	}
	if st.URL == "" {
		return unavailable("advertises no URL")
	}
	resp, err := m.internal.post(ctx, st.URL, continuation{Sub: c.Sub, State: req.Params.RequestState, Responses: req.Params.InputResponses})
	if err != nil {
		return unavailable("%v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxForwardedResult))
	if err != nil {
		return unavailable("did not finish its answer (%v)", err)
	}
	if resp.StatusCode == http.StatusBadGateway && resp.Header.Get(upstreamErrorHeader) != "" {
		var e forwardedError
		if err := json.Unmarshal(b, &e); err != nil {
			return unavailable("answered an upstream error that is not one (%v)", err)
		}
		return upstreamFailure(ctx, tool.Wrap(&mcpsrc.RPCError{Code: e.Code, Message: e.Message, Data: e.Data, Status: e.Status},
			tool.CodeBackendUnavailable, "%s (on replica %q)", e.Message, st.Replica))
	}
	if resp.StatusCode != http.StatusOK {
		return unavailable("refused it (%s)", resp.Status)
	}
	if resp.Header.Get(taskHeader) != "" {
		if !json.Valid(b) {
			return unavailable("answered a task that is not JSON")
		}
		if t := (&taskCreated{task: b}); passTask(ctx, t) {
			return nil, t
		}
		return unavailable("made it a task, which this answer cannot carry")
	}
	raw := json.RawMessage(b)
	res, err := mcp.ParseCallToolResult(&raw)
	if err != nil {
		return unavailable("answered what is not a result (%v)", err)
	}
	return res, nil
}

// post sends f to the replica at url, authenticated; the error says what
// went wrong, after "the replica which".
func (ic *internalCalls) post(ctx context.Context, url string, f continuation) (*http.Response, error) {
	body, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("cannot be sent it (%v)", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+internalPath, bytes.NewReader(body))
	if err != nil {
		ic.logger.Warn("replica's advertise_url is not a URL", "url", url, "error", err)
		return nil, errors.New("advertises a URL that is not one")
	}
	t := time.Now().UnixMilli()
	hreq.Header.Set(internalHeader, strconv.FormatInt(t, 10)+"."+ic.mac(t, body))
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := ic.client.Do(hreq)
	if err != nil {
		ic.logger.Warn("replica does not answer", "url", url, "error", err)
		return nil, errors.New("does not answer")
	}
	return resp, nil
}

// toHolder sends f, a client's request about a call's stream held by
// replica (at url), there, under ctx (which cancel ends), and returns its
// answer; when it cannot, it has answered the client with a 502 naming
// the replica and what (the stream, the call) cannot go on. A holder
// whose answer has not begun within resumeAnswer is taken as gone.
func (m *MCP) toHolder(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, replica, url, what string, f continuation) (*http.Response, bool) {
	unavailable := func(format string, args ...any) (*http.Response, bool) {
		http.Error(w, fmt.Sprintf("502 bad gateway: %s is held by replica %q, which "+format+
			"; its call cannot go on, call the tool again", append([]any{what, replica}, args...)...), http.StatusBadGateway)
		return nil, false
	}
	if url == "" {
		return unavailable("advertises no URL")
	}
	late := time.AfterFunc(resumeAnswer, cancel)
	resp, err := m.internal.post(ctx, url, f)
	if !late.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		return unavailable("did not answer within %v", resumeAnswer)
	}
	if err != nil {
		return unavailable("%v", err)
	}
	return resp, true
}

// forwardResume sends a client's resume of a stream held by replica (at
// url) there, and relays the answer: the stream as it comes, or the
// holder's refusal.
func (m *MCP) forwardResume(w http.ResponseWriter, r *http.Request, replica, url, session, lastEventID string) {
	ctx, cancel := context.WithCancel(r.Context()) // the client leaving ends the relay
	defer cancel()
	resp, ok := m.toHolder(ctx, cancel, w, replica, url, fmt.Sprintf("the stream of event %q", lastEventID),
		continuation{Resume: &streamResume{Session: session, LastEventID: lastEventID}})
	if !ok {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		noStream(w, lastEventID) // the holder's 404: it has no such stream
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
		if err != nil {
			return // the holder's stream ended (or broke: the client may resume again)
		}
	}
}

// forwardAnswer sends a client's answer to request id of a call held by
// replica (at url) there, and relays whether a call took it.
func (m *MCP) forwardAnswer(w http.ResponseWriter, r *http.Request, replica, url, session, id string, body []byte) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	resp, ok := m.toHolder(ctx, cancel, w, replica, url, fmt.Sprintf("the call awaiting the answer to request %q", id),
		continuation{Answer: &clientAnswer{Session: session, Body: body}})
	if !ok {
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		noAsk(w, id)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// noAsk answers a client's answer to a request no call awaits.
func noAsk(w http.ResponseWriter, id string) {
	http.Error(w, "404 not found: no call awaits the answer to request "+strconv.Quote(id)+
		" (it ended, was answered, or is not this session's)", http.StatusNotFound)
}

// serveInternal takes a forwarded continuation of a call this replica
// holds, and answers with the call's result (or its next input requests).
func (m *MCP) serveInternal(w http.ResponseWriter, r *http.Request, max int64) {
	header := r.Header.Get(internalHeader)
	if r.Method != http.MethodPost || header == "" {
		http.Error(w, "403 forbidden", http.StatusForbidden)
		return
	}
	body, ok := httpadmit.ReadBody(w, r, max)
	if !ok {
		return
	}
	if !m.internal.verify(header, body, time.Now()) {
		http.Error(w, "403 forbidden", http.StatusForbidden)
		return
	}
	var f continuation
	if err := json.Unmarshal(body, &f); err != nil {
		http.Error(w, "400 bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if f.Resume != nil {
		// Served here only: a stream is never forwarded twice. The
		// session is not idle here while its client resumes elsewhere.
		m.live.touch(f.Resume.Session)
		m.serveResume(w, r, f.Resume.Session, f.Resume.LastEventID)
		return
	}
	if f.Answer != nil {
		if !m.asks.deliver(f.Answer.Session, f.Answer.Body) {
			http.Error(w, "404 not found: no call here awaits this answer", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	res, err := m.continueHere(context.WithValue(r.Context(), forwardedKey{}, true), f)
	if t, ok := err.(*taskCreated); ok {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(taskHeader, "1")
		w.Write(t.task)
		return
	}
	var re *mcpsrc.RPCError
	if errors.As(err, &re) {
		// The upstream's error goes back as it is, for the forwarding
		// replica to answer its caller with.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(upstreamErrorHeader, "1")
		w.WriteHeader(http.StatusBadGateway)
		json.NewEncoder(w).Encode(forwardedError{re.Code, re.Message, re.Data, re.Status})
		return
	}
	if err != nil {
		http.Error(w, "502 the call failed: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

// continueHere goes on with the parked job f's state names.
func (m *MCP) continueHere(ctx context.Context, f continuation) (*mcp.CallToolResult, error) {
	j, err := m.jobs.resume(f.State, f.Sub)
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	j.deliver(f.Responses)
	return m.jobs.wait(ctx, j)
}
