package server

import (
	"encoding/json"
	"net/http"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/router"
)

// downCall answers a tools/call of a tool the catalog lacks because its
// source is down (a stdio server that would not start), named by its
// exposed name, as the capability RPC does: capability_backend_unavailable
// naming the server, why it is down and its (scrubbed) stderr tail, rather
// than mcp-go's "tool not found". Only a caller that may see such a tool
// gets it (Router.DownSource); for anyone else, and for anything else, it
// does nothing and says so.
func (m *MCP) downCall(w http.ResponseWriter, r *http.Request, body []byte) bool {
	p := m.parts.Load()
	snap := p.registry.Snapshot()
	c := CallerFrom(r.Context())
	if !snap.AnyDown() || c == nil {
		return false
	}
	version := r.Header.Get(mcp.HeaderProtocolVersion)
	modern := version == modernProtocol
	protocol := "mcp/" + modernProtocol
	if !modern {
		sess := m.live.get(r.Header.Get(mcpserver.HeaderKeySessionID))
		if sess == nil {
			return false
		}
		protocol = "mcp/" + sess.ProtocolVersion()
	}
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  struct {
			Name      string                     `json:"name"`
			Arguments json.RawMessage            `json:"arguments"`
			Meta      map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.JSONRPC != "2.0" || msg.Method != "tools/call" || !plainID(msg.ID) ||
		(modern && string(msg.Params.Meta["io.modelcontextprotocol/protocolVersion"]) != `"`+modernProtocol+`"`) {
		return false
	}
	if _, listed := snap.ByExposedName(msg.Params.Name); listed || p.router.DownSource(c, msg.Params.Name) == nil {
		return false
	}
	// Through the router, as any call: audited, and answered by its
	// resolve gate with the source's error.
	res, inv, err := p.router.Invoke(r.Context(), c, router.Request{Tool: msg.Params.Name, Input: msg.Params.Arguments, Protocol: protocol})
	out := append([]byte(`{"jsonrpc":"2.0","id":`), msg.ID...)
	out = append(append(append(out, `,"result":`...), mcpResult(res, err, inv, modern)...), "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
	return true
}
