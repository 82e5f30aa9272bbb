package server

import (
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// A planning call has the fast call's shape but is not the fast call's
// to serve: it reaches the planning path and runs nothing.
func TestPlanningIsNotAFastCall(t *testing.T) {
	s, front := open(t)
	tok := mint(t, token.Claims{Sub: "fast"})
	meta := `"_meta":{"capgate/mode":"planning","io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"fx__echo","arguments":{"message":"hi"},` + meta + `}}`
	before := s.MCP.fastCalls.Load()
	status, _, b := testkit.PostMCP(t, front, tok, "fx__echo", body)
	if took := s.MCP.fastCalls.Load() - before; took != 0 {
		t.Errorf("the fast call took a planning call")
	}
	if status != 200 || !strings.Contains(string(b), `"allowed":true`) || strings.Contains(string(b), `"echo"`) {
		t.Errorf("planning fx__echo: %d %s", status, b)
	}
	// A mode that is not "planning" is refused, saying where.
	status, _, b = testkit.PostMCP(t, front, tok, "fx__echo", strings.Replace(body, `"planning"`, `"dry"`, 1))
	if status != 200 || !strings.Contains(string(b), `_meta[\"capgate/mode\"] must be \"planning\", \"execution\" or absent, not \"dry\"`) ||
		!strings.Contains(string(b), `"isError":true`) {
		t.Errorf("mode dry: %d %s", status, b)
	}
}
