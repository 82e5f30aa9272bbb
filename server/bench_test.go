package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// BenchmarkFastCall is capgate serve's hot path, whole: a plain
// 2026-07-28 tools/call over a kept-alive loopback connection, through
// capgate's HTTP/1.1 loop, the token check, the router and the audit log,
// to the MCP fixture over streamable HTTP and back, A/B: "fast" is the
// front door (the fast call takes it), "mcp-go" the same server with every
// request sent through mcp-go's streamable transport. The fixture runs in
// its own process, so cpu-ns/op is this process's CPU per call (client
// and server); compare it and allocs/op, not ns/op alone, on a busy machine.
func BenchmarkFastCall(b *testing.B) {
	addr := testkit.FreeAddr(b)
	testkit.ServeMCPFixture(b, "-http", addr)
	s, front := serveSetup(b, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{
			Options: srcmcp.Options{Name: "fx", URL: "http://" + addr + "/mcp"}, Prefix: "fx",
			Tools: map[string]registry.Override{"t_00": {Level: risk.Low}},
		}}},
		grants: []string{"rye.execute.tool.mcp.fx.*"},
	})
	tok := mint(b, token.Claims{Sub: "bench"})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__t_00","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	general := httptest.NewServer(s.handler(false))
	b.Cleanup(general.Close)
	for _, path := range []struct{ name, url string }{{"fast", front}, {"mcp-go", general.URL}} {
		b.Run(path.name, func(b *testing.B) { benchCalls(b, path.url, tok, body) })
	}
}

func benchCalls(b *testing.B, url, tok, body string) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	call := func() {
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
		req.Header = http.Header{
			"Authorization": {"Bearer " + tok}, "Content-Type": {"application/json"},
			"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2026-07-28"},
			"Mcp-Method": {"tools/call"}, "Mcp-Name": {"fx__t_00"},
		}
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(out), `"text":"ok"`) {
			b.Fatalf("%d %s", resp.StatusCode, out)
		}
	}
	call()
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	for b.Loop() {
		call()
	}
	b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}
