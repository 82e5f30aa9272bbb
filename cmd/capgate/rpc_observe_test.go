package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// checkRPCObservability is TestObservability's part for the capability
// RPC, on its serve (upstream wx still up): /rpc calls that succeed, are
// denied and name an unknown tool are in rpc_server_call_duration_seconds
// and each has a server span with its gates and upstream call under it.
func checkRPCObservability(t *testing.T, base, metricsURL, tok string, rc *receiver) {
	const parentSpan = "00f067aa0ba902b7"
	traces := map[string]string{ // a trace of its own per call, to find its span
		"ok":      "6af92f3577b34da6a3ce929d0e0e0001",
		"denied":  "6af92f3577b34da6a3ce929d0e0e0002",
		"unknown": "6af92f3577b34da6a3ce929d0e0e0003",
	}
	invoke := func(id int, trace, capability string) string {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "capability.invoke",
			"params": map[string]any{"context_token": tok, "capability": capability, "input": map[string]any{"city": "Lima"}}})
		req, _ := http.NewRequest(http.MethodPost, base+"/rpc", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+trace+"-"+parentSpan+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return b.String()
	}
	if got := invoke(41, traces["ok"], "mcp:wx:get_weather"); !strings.Contains(got, "sunny in Lima") {
		t.Fatalf("/rpc allowed call: %s", got)
	}
	if got := invoke(42, traces["denied"], "mcp:wx:forecast"); !strings.Contains(got, `"code":"permission_denied"`) {
		t.Fatalf("/rpc denied call: %s", got)
	}
	if got := invoke(43, traces["unknown"], "mcp:wx:no_such_tool_4711"); !strings.Contains(got, `"code":"capability_not_found"`) {
		t.Fatalf("/rpc unknown tool: %s", got)
	}

	// The other methods are counted too: a listing, and one refused for
	// its token.
	post := func(body string) string {
		resp, err := http.Post(base+"/rpc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return b.String()
	}
	if got := post(`{"jsonrpc":"2.0","id":44,"method":"capability.list","params":{"context_token":"` + tok + `"}}`); !strings.Contains(got, "mcp:wx:get_weather") {
		t.Fatalf("/rpc capability.list: %s", got)
	}
	if got := post(`{"jsonrpc":"2.0","id":45,"method":"capability.list","params":{"context_token":"not-a-token"}}`); !strings.Contains(got, `"code":"token_invalid"`) {
		t.Fatalf("/rpc capability.list with a bad token: %s", got)
	}
	if got := post(`{"jsonrpc":"2.0","id":46,"method":"capability.nope","params":{}}`); !strings.Contains(got, "-32601") {
		t.Fatalf("/rpc unknown method: %s", got)
	}

	fams := scrape(t, metricsURL)
	count := func(tool, errType string) uint64 {
		m := series(fams, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "capability.invoke", "gen_ai_tool_name": tool, "error_type": errType})
		return m.GetHistogram().GetSampleCount()
	}
	for _, c := range []struct {
		tool, errType string
	}{{"wx__get_weather", ""}, {"wx__forecast", "permission_denied"}, {"other", "capability_not_found"}} {
		if n := count(c.tool, c.errType); n != 1 {
			t.Errorf("/rpc calls of %s with error_type %q: %d, want 1; the family: %v", c.tool, c.errType, n, fams["rpc_server_call_duration_seconds"])
		}
	}
	for _, c := range []struct{ method, errType string }{{"capability.list", ""}, {"capability.list", "token_invalid"}, {"other", "-32601"}} {
		m := series(fams, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": c.method, "gen_ai_tool_name": "", "error_type": c.errType})
		if n := m.GetHistogram().GetSampleCount(); n != 1 {
			t.Errorf("/rpc %s requests with error_type %q: %d, want 1", c.method, c.errType, n)
		}
	}
	for _, m := range fams["rpc_server_call_duration_seconds"].GetMetric() {
		for _, l := range m.Label {
			if strings.Contains(l.GetValue(), "no_such_tool") {
				t.Errorf("a caller's tool name became a label: %v", m.Label)
			}
		}
	}

	// The spans: one server span per call, under the caller's, with the
	// MCP call's attributes and outcome.
	for what, want := range map[string]struct{ name, tool, id, errType string }{
		"ok":      {"capability.invoke wx__get_weather", "wx__get_weather", "mcp:wx:get_weather", ""},
		"denied":  {"capability.invoke wx__forecast", "wx__forecast", "mcp:wx:forecast", "permission_denied"},
		"unknown": {"capability.invoke other", "other", "", "capability_not_found"},
	} {
		spans := rc.waitFor(t, traces[what], want.name)
		var server *tracepb.Span
		for _, s := range spans {
			if s.Name == want.name && s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				server = s
			}
		}
		if server == nil {
			t.Errorf("%s: no server span %q", what, want.name)
			continue
		}
		if hex.EncodeToString(server.ParentSpanId) != parentSpan {
			t.Errorf("%s: the server span's parent %x, want the caller's %s", what, server.ParentSpanId, parentSpan)
		}
		for k, v := range map[string]string{"rpc.system.name": "jsonrpc", "rpc.method": "capability.invoke", "gen_ai.tool.name": want.tool,
			"capgate.tool.id": want.id, "jsonrpc.request.id": fmt.Sprint(map[string]int{"ok": 41, "denied": 42, "unknown": 43}[what]),
			"network.transport": "tcp", "error.type": want.errType} {
			if got := spanAttr(server, k); got != v {
				t.Errorf("%s: the server span's %s = %q, want %q", what, k, got, v)
			}
		}
		failed := server.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR
		if failed != (want.errType != "") {
			t.Errorf("%s: the server span's status %v, want an error: %v", what, server.Status, want.errType != "")
		}
		children := map[string]bool{}
		for _, s := range spans {
			if string(s.ParentSpanId) == string(server.SpanId) {
				children[s.Name] = true
			}
		}
		if !children["gate resolve"] {
			t.Errorf("%s: no gate span under the server span; children: %v", what, keys(children))
		}
		if what == "ok" && !children["tools/call get_weather"] {
			t.Errorf("ok: the upstream call is not under the server span; children: %v", keys(children))
		}
	}
}
