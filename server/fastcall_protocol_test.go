package server

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// TestFastCallSpeaksTheGeneralPathsProtocol (issue 31): with an upstream
// that speaks 2026-07-28 and 2025-11-25, and the per-caller protocol hook
// app gives every streamable-HTTP upstream, a tools/call reaches the
// upstream at the same revision whichever path serves it: a 2025-11-25
// session's call at 2025-11-25 (on the fast call, with a progress token
// on mcp-go's path, and on the handler that sends everything through
// mcp-go), a stateless call at 2026-07-28. The upstream's
// served_protocol says at which revision it was called.
func TestFastCallSpeaksTheGeneralPathsProtocol(t *testing.T) {
	s, front := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{
			Options: srcmcp.Options{Name: "cf", URL: conformance.StartFixture(t), Hooks: srcmcp.Hooks{
				Protocol: mcpserver.RequestProtocolVersion,
				SessionKey: func(ctx context.Context) string {
					if c := CallerFrom(ctx); c != nil {
						return c.Sub
					}
					return ""
				},
			}},
			Prefix: "cf", Tools: map[string]registry.Override{"served_protocol": {Level: risk.Low}},
		}}},
		grants: []string{"rye.fetch.tool.mcp.cf.*", "rye.execute.tool.mcp.cf.served_protocol"},
	})
	hs := httptest.NewServer(s.handler(false))
	t.Cleanup(hs.Close)
	tok := mint(t, token.Claims{Sub: "proto"})
	served := func(t *testing.T, post func(base string) (int, string, []byte), base string, wantFast bool, want string) {
		t.Helper()
		before := s.MCP.fastCalls.Load()
		st, _, b := post(base)
		if fast := s.MCP.fastCalls.Load() != before; fast != wantFast {
			t.Errorf("served by the fast call: %v, want %v", fast, wantFast)
		}
		if st != 200 || !strings.Contains(string(b), `"text":"`+want+`"`) {
			t.Errorf("the upstream served the call at %d %s, want %s", st, b, want)
		}
	}

	t.Run("2025-11-25", func(t *testing.T) {
		sid := testkit.OpenSession(t, front, tok, "{}")
		call := func(meta string) func(base string) (int, string, []byte) {
			return func(base string) (int, string, []byte) {
				return testkit.PostSession(t, base, tok, sid,
					`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"cf__served_protocol","arguments":{}`+meta+`}}`)
			}
		}
		served(t, call(""), front, true, "2025-11-25")
		served(t, call(`,"_meta":{"progressToken":"p"}`), front, false, "2025-11-25")
		served(t, call(""), hs.URL, false, "2025-11-25")
	})
	t.Run("2026-07-28", func(t *testing.T) {
		const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}`
		call := func(progress string) func(base string) (int, string, []byte) {
			return func(base string) (int, string, []byte) {
				return testkit.PostMCP(t, base, tok, "cf__served_protocol",
					`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"cf__served_protocol","arguments":{},`+meta+progress+`}}}`)
			}
		}
		served(t, call(""), front, true, "2026-07-28")
		served(t, call(`,"progressToken":"p"`), front, false, "2026-07-28")
		served(t, call(""), hs.URL, false, "2026-07-28")
	})
}
