package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/internal/paramheader"
	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
)

// The fast call: a plain tools/call is served on the request's goroutine,
// straight through the router, without mcp-go's per-request session, its
// notification forwarder and a job, each of which costs a goroutine
// hand-off. It serves both protocols: a stateless 2026-07-28 call, and a
// call in a 2025-11-25 (or 2025-06-18) session that mcp-go opened and
// still holds. It takes only calls whose whole answer is one JSON result:
// no progress token, no log level (per request on 2026-07-28, set with
// logging/setLevel on a session), a client that declared neither
// sampling, elicitation nor roots (so nothing can be asked of it
// mid-call), no requestState, no task. Anything
// else, and anything malformed, it leaves untouched to mcp-go, which
// answers it as before, errors included. The result is built as mcp-go
// builds it (TestFastCallMatchesMCPGo holds them together).

// modernProtocol is the stateless revision the fast call serves.
const modernProtocol = mcp.ProtocolVersion20260728

// sessionProtocols are the session revisions whose tools/call results the
// fast call writes as mcp-go does, each with the protocol its calls are
// routed under (made once, not per call).
var sessionProtocols = map[string]string{"2025-11-25": "mcp/2025-11-25", "2025-06-18": "mcp/2025-06-18"}

// The members the fast call reads of a request body, in the order of
// their values in fastCallMessage.
var (
	messageNames = []string{"jsonrpc", "id", "method", "params"}
	paramsNames  = []string{"name", "arguments", "requestState", "inputResponses", "task", "_meta", "requestId"}
	metaNames    = []string{"progressToken", "io.modelcontextprotocol/protocolVersion",
		"io.modelcontextprotocol/clientCapabilities", "io.modelcontextprotocol/logLevel", metaMode,
		"io.modelcontextprotocol/clientInfo"} // read by no one: known, so the fast call may take it
	capsNames = []string{"sampling", "elicitation", "roots"}
)

// fastCallMessage is what the fast call reads of a request body, as
// written: picked out by rawjson, which refuses anything encoding/json
// (and so mcp-go) might read otherwise.
type fastCallMessage struct {
	jsonrpc, id, method, params                                  []byte
	name, arguments, requestState, inputResponses, task, meta    []byte
	requestID                                                    []byte // of notifications/cancelled
	progressToken, protocolVersion, clientCapabilities, logLevel []byte
	mode                                                         []byte // capgate/mode: planning is not for the fast call
	unknown                                                      bool   // a member the fast call does not know
}

// posted is a POSTed body, its top-level members (messageNames) picked
// at most once for the front door's op (begin) and the fast call alike.
type posted struct {
	body                   []byte
	top                    [4][]byte
	picked, object, others bool
}

// members are the body's top-level members; ok is false when it is not a
// JSON object rawjson reads with confidence.
func (p *posted) members() (top *[4][]byte, ok bool) {
	if !p.picked {
		p.picked = true
		p.object, p.others = rawjson.PickOthers(p.body, messageNames, p.top[:])
	}
	return &p.top, p.object
}

// read picks the message out of the body; false when it is not a
// JSON-RPC message the fast call can read with confidence. A member the
// fast call does not know (at the top, in params or in _meta) leaves
// msg.unknown set: the call is left to mcp-go (fail closed, so a parameter
// added to MCP later reaches mcp-go until the fast call is taught it).
func (msg *fastCallMessage) read(p *posted) bool {
	var params [7][]byte
	var meta [6][]byte
	top, ok := p.members()
	if !ok {
		return false
	}
	ok, others := rawjson.PickOthers(top[3], paramsNames, params[:])
	if !ok {
		return false
	}
	msg.unknown = p.others || others
	if params[5] != nil {
		if ok, others = rawjson.PickOthers(params[5], metaNames, meta[:]); !ok {
			return false
		}
		msg.unknown = msg.unknown || others
	}
	msg.jsonrpc, msg.id, msg.method, msg.params = top[0], top[1], top[2], top[3]
	msg.name, msg.arguments, msg.requestState, msg.inputResponses, msg.task, msg.meta =
		params[0], params[1], params[2], params[3], params[4], params[5]
	msg.requestID = params[6]
	msg.progressToken, msg.protocolVersion, msg.clientCapabilities, msg.logLevel = meta[0], meta[1], meta[2], meta[3]
	msg.mode = meta[4]
	return true
}

// ServeHTTP serves /mcp for a caller bearerAuth admitted: a POST's body is
// read (bounded) first, then served by the fast call when it is one, else
// by mcp-go's streamable transport.
func (m *MCP) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.serve(w, r, true, MaxRequestBytes) }

// serve is ServeHTTP with a body limit, and the fast call or (fast false)
// not.
func (m *MCP) serve(w http.ResponseWriter, r *http.Request, fast bool, limit int64) {
	m.live.touch(r.Header.Get(mcpserver.HeaderKeySessionID)) // not idle: see expire.go
	if r.Method == http.MethodPost {
		body, ok := httpadmit.ReadBody(w, r, limit)
		if !ok {
			return
		}
		p := &posted{body: body}
		if m.observed() {
			var op *telemetry.Op
			r, op = m.begin(r, p)
			defer op.End()
		}
		if m.answerAsk(w, r, body) || m.taskMethod(w, r, p) || (fast && m.fastCall(w, r, p)) || m.downCall(w, r, body) ||
			(fast && m.streamCall(w, r, p)) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if patch, pr := newErrorPatch(w, r, p); patch != nil {
			defer patch.release()
			w, r = patch, pr
		}
	} else if id := r.Header.Get(mcp.HeaderLastEventID); id != "" && r.Method == http.MethodGet && m.resumeStream(w, r, id) {
		return
	}
	m.stream.ServeHTTP(w, r)
}

// fastCall serves r when it is a fast call, and says whether it did. A
// session's notifications/cancelled reaches the fast call it names here,
// and mcp-go after.
func (m *MCP) fastCall(w http.ResponseWriter, r *http.Request, body *posted) bool {
	h := r.Header
	version := h.Get(mcp.HeaderProtocolVersion)
	modern := version == modernProtocol
	protocol, session := sessionProtocols[version]
	if modern {
		protocol = "mcp/" + modernProtocol
	}
	if (!modern && !session) || h.Get(mcp.HeaderLastEventID) != "" ||
		!isJSONType(h.Get("Content-Type")) ||
		(modern && h.Get("Mcp-Method") != "tools/call") {
		return false
	}
	var msg fastCallMessage
	if !msg.read(body) {
		return false
	}
	var sess *liveSession
	if !modern {
		if sess = m.live.get(h.Get(mcpserver.HeaderKeySessionID)); sess == nil || sess.ProtocolVersion() != version {
			return false
		}
		if string(msg.method) == `"notifications/cancelled"` {
			sess.cancel(msg.requestID)
			return false
		}
	}
	name, ok := plainString(msg.name)
	if msg.unknown || string(msg.jsonrpc) != `"2.0"` || string(msg.method) != `"tools/call"` || !plainID(msg.id) ||
		!ok || !plainName(name) || present(msg.requestState) || present(msg.inputResponses) ||
		present(msg.task) || present(msg.progressToken) || present(msg.logLevel) || msg.mode != nil ||
		(present(msg.arguments) && msg.arguments[0] != '{') {
		return false
	}
	if modern {
		if h.Get("Mcp-Name") != name || string(msg.protocolVersion) != `"`+modernProtocol+`"` ||
			!askNothing(msg.clientCapabilities) {
			return false
		}
	} else if msg.protocolVersion != nil || !sess.asksNothing() {
		return false
	}
	// A tool the caller may not see is not found, as mcp-go's filter has it.
	c := CallerFrom(r.Context())
	p := m.parts.Load()
	d, ok := p.registry.Snapshot().ByExposedName(name)
	if c == nil || !ok || !p.router.Visible(c, d) {
		return false
	}
	var args json.RawMessage
	if present(msg.arguments) {
		args = msg.arguments
	}
	// Its x-mcp-header arguments came in Mcp-Param-* headers too, which
	// must agree with the body, as mcp-go checks them (2026-07-28 only: a
	// session's revision defines no such headers).
	if modern {
		if err := paramheader.Check(h, d.InputSchema, args, true); err != nil {
			writeRPCError(w, msg.id, mcp.HEADER_MISMATCH, err.Error(), nil)
			m.fastCalls.Add(1)
			return true
		}
	}
	ctx := r.Context()
	if sess != nil {
		var done func()
		ctx, done = sess.track(ctx, msg.id)
		defer done()
		// The session's revision, as mcp-go's path gives it: an upstream
		// that speaks both serves this caller at 2025-11-25 on either path
		// (sources/mcp Hooks.Protocol).
		ctx = mcpserver.WithRequestProtocolInfo(ctx, &mcpserver.RequestProtocolInfo{ProtocolVersion: version})
	}
	res, inv, err := p.router.Invoke(ctx, c, router.Request{Tool: name, Input: args, Protocol: protocol})
	if m.observed() {
		telemetry.OpFrom(ctx).Fail(outcome(res != nil && res.IsError, err))
	}
	if writeUpstreamError(w, msg.id, err, modern) {
		m.fastCalls.Add(1)
		return true
	}
	b := make([]byte, 0, 384+len(msg.id)) // room for _meta with the invocation
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, msg.id...)
	b = append(b, `,"result":`...)
	// The call has run: from here on the answer is this one, whatever
	// happens, so that nothing runs it twice.
	var plain bool
	if err == nil {
		b, plain = appendPlainResult(b, res, &inv, modern)
	}
	if !plain {
		b = append(b, mcpResult(res, err, inv, modern)...)
	}
	b = append(b, "}\n"...)
	setJSONAnswer(w.Header(), inv.End)
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	m.fastCalls.Add(1)
	return true
}

// plainString is the JSON string v without its quotes, when it has no
// escapes to undo.
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return "", false
	}
	return string(v[1 : len(v)-1]), true
}

// mcpResult is res (or the denial err) as mcp-go writes a result, of the
// modern protocol or a session's.
func mcpResult(res *tool.Result, err error, inv router.Invocation, modern bool) []byte {
	var result *mcp.CallToolResult
	if err == nil {
		result, err = mcpconv.ToResult(res)
	}
	if err != nil {
		result = mcpconv.Denial(err)
	}
	withInvocation(result, inv)
	if modern {
		if result.ResultType == "" {
			result.ResultType = mcp.ResultTypeComplete
		}
		if meta := result.EnsureResultMeta(); meta.ServerInfo() == nil {
			meta.SetServerInfo(serverInfo)
		}
	}
	out, err := json.Marshal(result)
	if err != nil {
		out, _ = json.Marshal(mcpconv.Denial(tool.Wrap(err, tool.CodeInternal, "capgate could not encode the result")))
	}
	return out
}

// serverInfo is how capgate names itself in results.
var (
	serverInfo     = mcp.Implementation{Name: "capgate", Version: buildinfo.Version()}
	serverInfoJSON = func() []byte { b, _ := json.Marshal(serverInfo); return b }()
)

// appendPlainResult appends res as mcp-go writes a result, when its
// content is plain text blocks (which mcp-go would decode and encode back
// unchanged) and its structured content an object; else it appends
// nothing and says no.
func appendPlainResult(b []byte, res *tool.Result, inv *router.Invocation, modern bool) ([]byte, bool) {
	for _, c := range res.Content {
		if !plainText(c) {
			return b, false
		}
	}
	if st := res.Structured; len(st) > 0 && st[0] != '{' {
		return b, false
	}
	for _, e := range inv.SideEffects {
		if !plainTag(string(e)) {
			return b, false
		}
	}
	b = append(b, `{"_meta":{`...)
	if modern {
		b = append(b, `"io.modelcontextprotocol/serverInfo":`...)
		b = append(b, serverInfoJSON...)
		b = append(b, ',')
	}
	b = appendInvocation(b, inv)
	b = append(b, `},"content":[`...)
	for i, c := range res.Content {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c...)
	}
	b = append(b, ']')
	if len(res.Structured) > 0 {
		b = append(b, `,"structuredContent":`...)
		b = append(b, res.Structured...)
	}
	if res.IsError {
		b = append(b, `,"isError":true`...)
	}
	if modern {
		b = append(b, `,"resultType":"complete"`...)
	}
	return append(b, '}'), true
}

// plainText says whether a content block is {"type":"text","text":"…"},
// its keys in either order and nothing else. The block is valid JSON
// already (it was read as a json.RawMessage).
func plainText(c json.RawMessage) bool {
	if rest, ok := bytes.CutPrefix(c, []byte(`{"type":"text","text":`)); ok {
		n := jsonStringLen(rest)
		return n > 0 && string(rest[n:]) == "}"
	}
	if rest, ok := bytes.CutPrefix(c, []byte(`{"text":`)); ok {
		n := jsonStringLen(rest)
		return n > 0 && string(rest[n:]) == `,"type":"text"}`
	}
	return false
}

// jsonStringLen is the length of the JSON string b starts with, or 0.
func jsonStringLen(b []byte) int {
	if len(b) == 0 || b[0] != '"' {
		return 0
	}
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return 0
}

func isJSONType(ct string) bool {
	return ct == "application/json" || strings.HasPrefix(ct, "application/json;")
}

func present(v []byte) bool {
	return len(v) > 0 && string(v) != "null"
}

// plainID is a JSON-RPC id the fast call echoes as it came: a string
// without escapes or a small integer.
func plainID(id []byte) bool {
	if len(id) < 1 || len(id) > 64 {
		return false
	}
	if id[0] == '"' {
		return len(id) >= 2 && id[len(id)-1] == '"' && bytes.IndexByte(id[1:len(id)-1], '\\') < 0 &&
			bytes.IndexByte(id[1:len(id)-1], '"') < 0
	}
	if len(id) > 15 {
		return false
	}
	for i, c := range id {
		if (c < '0' || c > '9') && !(i == 0 && c == '-' && len(id) > 1) {
			return false
		}
	}
	return true
}

// plainName is a tool name that travels in Mcp-Name as it is.
func plainName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// askNothing says whether declared client capabilities leave nothing an
// upstream could ask the client mid-call.
// A capability it does not know could be one: fail closed.
func askNothing(caps []byte) bool {
	var c [3][]byte
	ok, others := rawjson.PickOthers(caps, capsNames, c[:])
	return ok && !others && !present(c[0]) && !present(c[1]) && !present(c[2])
}

// appendInvocation appends withInvocation's _meta members. The id is hex and the side effects are
// plainTag (appendPlainResult checks), so neither needs escaping.
func appendInvocation(b []byte, inv *router.Invocation) []byte {
	b = append(b, `"capgate/invocation_id":"`...)
	b = append(b, inv.ID...)
	b = append(b, `","capgate/duration_ms":`...)
	b = strconv.AppendFloat(b, inv.DurationMS(), 'f', -1, 64)
	b = append(b, `,"capgate/side_effects":[`...)
	for i, e := range inv.SideEffects {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, e...)
		b = append(b, '"')
	}
	return append(b, ']')
}

// plainTag is a side-effect tag that is its own JSON string body.
func plainTag(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
