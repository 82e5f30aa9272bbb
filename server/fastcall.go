package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/internal/h1"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// The fast call: a plain tools/call of the stateless 2026-07-28 protocol
// is served on the connection's goroutine, straight through the router,
// without mcp-go's per-request session, its notification forwarder and a
// job, each of which costs a goroutine hand-off. It takes only calls whose
// whole answer is one JSON result: no progress token, no log level, a
// client that declared neither sampling, elicitation nor roots (so nothing
// can be asked of it mid-call), no requestState, no task, no Mcp-Param
// headers. Anything else, and anything malformed, it leaves untouched to
// mcp-go, which answers it as before, errors included. The result is built
// as mcp-go builds it (TestFastCallMatchesMCPGo holds them together).

// modernProtocol is the revision the fast call serves.
const modernProtocol = mcp.ProtocolVersion20260728

// fastCallMessage is what the fast call reads of a request body.
type fastCallMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		Name           string          `json:"name"`
		Arguments      json.RawMessage `json:"arguments"`
		RequestState   json.RawMessage `json:"requestState"`
		InputResponses json.RawMessage `json:"inputResponses"`
		Task           json.RawMessage `json:"task"`
		Meta           struct {
			ProgressToken      json.RawMessage `json:"progressToken"`
			ProtocolVersion    string          `json:"io.modelcontextprotocol/protocolVersion"`
			ClientCapabilities json.RawMessage `json:"io.modelcontextprotocol/clientCapabilities"`
			LogLevel           json.RawMessage `json:"io.modelcontextprotocol/logLevel"`
		} `json:"_meta"`
	} `json:"params"`
}

// fastCall serves r when it is a fast call, and says whether it did.
func (m *MCP) fastCall(w http.ResponseWriter, c *router.Caller, r *h1.Request) bool {
	h := r.Header
	if r.Method != http.MethodPost || h.Get("Mcp-Method") != "tools/call" ||
		h.Get(mcp.HeaderProtocolVersion) != modernProtocol || h.Get(mcp.HeaderLastEventID) != "" ||
		!isJSONType(h.Get("Content-Type")) || hasParamHeader(h) {
		return false
	}
	var msg fastCallMessage
	if json.Unmarshal(r.Body, &msg) != nil {
		return false
	}
	p := &msg.Params
	if msg.JSONRPC != "2.0" || msg.Method != "tools/call" || !plainID(msg.ID) ||
		!plainName(p.Name) || h.Get("Mcp-Name") != p.Name ||
		present(p.RequestState) || present(p.InputResponses) || present(p.Task) ||
		present(p.Meta.ProgressToken) || present(p.Meta.LogLevel) ||
		p.Meta.ProtocolVersion != modernProtocol || !askNothing(p.Meta.ClientCapabilities) ||
		(present(p.Arguments) && bytes.TrimSpace(p.Arguments)[0] != '{') {
		return false
	}
	// A tool the caller may not see is not found, as mcp-go's filter has it.
	d, ok := m.registry.Snapshot().ByExposedName(p.Name)
	if !ok || !m.router.Visible(c, d) || bytes.Contains(d.InputSchema, []byte("x-mcp-header")) {
		return false
	}
	var args json.RawMessage
	if present(p.Arguments) {
		args = p.Arguments
	}
	res, err := m.router.Call(r.Context(), c, router.Request{Tool: p.Name, Input: args, Protocol: "mcp/" + modernProtocol})
	b := make([]byte, 0, 256+len(msg.ID))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, msg.ID...)
	b = append(b, `,"result":`...)
	// The call has run: from here on the answer is this one, whatever
	// happens, so that nothing runs it twice.
	var plain bool
	if err == nil {
		b, plain = appendPlainResult(b, res)
	}
	if !plain {
		b = append(b, mcpResult(res, err)...)
	}
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	m.fastCalls.Add(1)
	return true
}

// mcpResult is res (or the denial err) as mcp-go writes a modern result.
func mcpResult(res *tool.Result, err error) []byte {
	var result *mcp.CallToolResult
	if err == nil {
		result, err = toMCPResult(res)
	}
	if err != nil {
		result = denial(err)
	}
	if result.ResultType == "" {
		result.ResultType = mcp.ResultTypeComplete
	}
	if meta := result.EnsureResultMeta(); meta.ServerInfo() == nil {
		meta.SetServerInfo(serverInfo)
	}
	out, err := json.Marshal(result)
	if err != nil {
		out, _ = json.Marshal(denial(tool.Wrap(err, tool.CodeInternal, "capgate could not encode the result")))
	}
	return out
}

// serverInfo is how capgate names itself in results.
var (
	serverInfo     = mcp.Implementation{Name: "capgate", Version: capgate.Version}
	serverInfoJSON = func() []byte { b, _ := json.Marshal(serverInfo); return b }()
)

// appendPlainResult appends res as mcp-go writes a modern result, when its
// content is plain text blocks (which mcp-go would decode and encode back
// unchanged) and its structured content an object; else it appends
// nothing and says no.
func appendPlainResult(b []byte, res *tool.Result) ([]byte, bool) {
	for _, c := range res.Content {
		if !plainText(c) {
			return b, false
		}
	}
	if st := res.Structured; len(st) > 0 && st[0] != '{' {
		return b, false
	}
	b = append(b, `{"_meta":{"io.modelcontextprotocol/serverInfo":`...)
	b = append(b, serverInfoJSON...)
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
	return append(b, `,"resultType":"complete"}`...), true
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

// hasParamHeader: a tool's x-mcp-header parameters travel in Mcp-Param-*
// headers, which mcp-go checks against the body.
func hasParamHeader(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Mcp-Param-") {
			return true
		}
	}
	return false
}

func present(v json.RawMessage) bool {
	return len(v) > 0 && string(v) != "null"
}

// plainID is a JSON-RPC id the fast call echoes as it came: a string
// without escapes or a small integer.
func plainID(id json.RawMessage) bool {
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
func askNothing(caps json.RawMessage) bool {
	caps = bytes.TrimSpace(caps)
	if len(caps) == 0 || caps[0] != '{' {
		return false
	}
	var c struct {
		Sampling    json.RawMessage `json:"sampling"`
		Elicitation json.RawMessage `json:"elicitation"`
		Roots       json.RawMessage `json:"roots"`
	}
	if json.Unmarshal(caps, &c) != nil {
		return false
	}
	return !present(c.Sampling) && !present(c.Elicitation) && !present(c.Roots)
}
