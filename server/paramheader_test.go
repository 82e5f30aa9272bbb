package server

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// TestFastCallParamHeaders: the fast call now serves 2026-07-28 calls of
// tools with x-mcp-header parameters (it left them all to mcp-go before),
// checking their Mcp-Param-* headers as mcp-go does: each case answers
// byte for byte as on the handler without the fast call (status and
// body), and the fast call served it. In a 2025-11-25 session the
// headers are not checked on either path.
func TestFastCallParamHeaders(t *testing.T) {
	addr := testkit.FreeAddr(t)
	testkit.ServeFixture(t, testkit.HeadersFixture, 15*time.Second, addr, "-http", addr)
	s, front := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{
			Options: srcmcp.Options{Name: "hf", URL: "http://" + addr + "/mcp"},
			Prefix:  "hf", Tools: map[string]registry.Override{"valid_tool": {Level: risk.Low}},
		}}},
		grants: []string{"rye.fetch.tool.mcp.hf.*", "rye.execute.tool.mcp.hf.valid_tool"},
	})
	general := httptest.NewServer(s.handler(false))
	t.Cleanup(general.Close)
	tok := mint(t, token.Claims{Sub: "headers"})
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	for _, tc := range []struct {
		name, args string
		header     map[string]string
		status     int
	}{
		{"agrees", `{"region":"us-west1"}`, map[string]string{"Mcp-Param-Region": "us-west1"}, 200},
		{"base64", `{"region":"Hello"}`, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8=?="}, 200},
		{"spaces", `{"region":"us-west1"}`, map[string]string{"Mcp-Param-Region": "  us-west1 "}, 200},
		{"differs", `{"region":"us-west1"}`, map[string]string{"Mcp-Param-Region": "eu-west1"}, 400},
		{"missing", `{"region":"us-west1"}`, nil, 400},
		{"bad base64", `{"region":"Hello"}`, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8?="}, 400},
		{"for an absent argument", `{}`, map[string]string{"Mcp-Param-Region": "us"}, 400},
	} {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"hf__valid_tool","arguments":%s,%s}}`, tc.args, meta)
		before := s.MCP.fastCalls.Load()
		fst, _, fb := testkit.PostMCPWith(t, front, tok, "tools/call", "hf__valid_tool", body, tc.header)
		if s.MCP.fastCalls.Load() == before {
			t.Errorf("%s: not served by the fast call", tc.name)
		}
		gst, _, gb := testkit.PostMCPWith(t, general.URL, tok, "tools/call", "hf__valid_tool", body, tc.header)
		// A result carries its own invocation id and duration: only an
		// error is compared whole.
		same := fst == gst && (fst == 200 && bytes.Contains(fb, []byte(`mcp-param-region`)) && bytes.Contains(gb, []byte(`mcp-param-region`)) ||
			bytes.Equal(fb, gb))
		if fst != tc.status || !same {
			t.Errorf("%s: the fast call answered %d %s\nmcp-go %d %s\nwant status %d", tc.name, fst, fb, gst, gb, tc.status)
		}
		if tc.status == 400 && !bytes.Contains(fb, []byte(`"code":-32020`)) {
			t.Errorf("%s: not -32020: %s", tc.name, fb)
		}
	}

	t.Run("2025-11-25 session", func(t *testing.T) {
		sid := testkit.OpenSession(t, front, tok, "{}")
		before := s.MCP.fastCalls.Load()
		st, _, b := testkit.PostSessionWith(t, front, tok, sid,
			`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"hf__valid_tool","arguments":{"region":"us"}}}`,
			map[string]string{"Mcp-Param-Region": "eu"})
		if st != 200 || bytes.Contains(b, []byte(`"isError":true`)) || bytes.Contains(b, []byte(`"error"`)) {
			t.Errorf("a session's call with an Mcp-Param header: %d %s", st, b)
		}
		if s.MCP.fastCalls.Load() == before {
			t.Errorf("the session's call was not served by the fast call")
		}
		// Here the upstream link speaks 2026-07-28 (no per-caller protocol
		// hook): what it got is mirrored from the body, never the
		// caller's header.
		if !bytes.Contains(b, []byte(`\"mcp-param-region\":[\"us\"]`)) {
			t.Errorf("the upstream received: %s", b)
		}
	})
}
