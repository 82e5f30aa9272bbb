package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// upstream is a real streamable-HTTP MCP server (mcp-go) in the test's
// process, with one tool, get_weather, that keeps the trace context it
// was sent: in the HTTP headers and in params._meta.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	headers []string // traceparent headers of tools/call requests
	metas   []string // params._meta.traceparent of calls
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	s := mcpserver.NewMCPServer("weather", "1", mcpserver.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("get_weather", mcp.WithDescription("The weather in a city"), mcp.WithString("city")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			tp := ""
			if m := req.Params.Meta; m != nil {
				tp, _ = m.AdditionalFields["traceparent"].(string)
			}
			u.mu.Lock()
			u.metas = append(u.metas, tp)
			u.mu.Unlock()
			return mcp.NewToolResultText("sunny in " + req.GetString("city", "?")), nil
		})
	s.AddTool(mcp.NewTool("forecast", mcp.WithDescription("Tomorrow's weather"), mcp.WithString("city")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("rain"), nil
		})
	h := mcpserver.NewStreamableHTTPServer(s)
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			if strings.Contains(string(b), `"tools/call"`) {
				u.mu.Lock()
				u.headers = append(u.headers, r.Header.Get("traceparent"))
				u.mu.Unlock()
			}
			r.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) seen() (headers, metas []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.headers...), append([]string(nil), u.metas...)
}

// receiver is an OTLP/HTTP trace receiver: it decodes every
// ExportTraceServiceRequest capgate posts to /v1/traces.
type receiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		var req collector.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, fmt.Sprintf("bad export to %s: %v", r.URL.Path, err), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ = proto.Marshal(&collector.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// waitFor returns the spans of trace traceID once it has a span of each
// of names.
func (rc *receiver) waitFor(t *testing.T, traceID string, names ...string) []*tracepb.Span {
	t.Helper()
	var out []*tracepb.Span
	var missing []string
	if !testkit.Poll(15*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		out = out[:0]
		seen := map[string]bool{}
		for _, s := range rc.spans {
			if hex.EncodeToString(s.TraceId) == traceID {
				out = append(out, s)
				seen[s.Name] = true
			}
		}
		missing = missing[:0]
		for _, n := range names {
			if !seen[n] {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0
	}) {
		t.Fatalf("no span %q in trace %s; got %d spans in it", missing, traceID, len(out))
	}
	return out
}

func spanIntAttr(s *tracepb.Span, key string) int64 {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetIntValue()
		}
	}
	return 0
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// scrape reads the metrics endpoint and parses it as Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// series finds the metric of family name whose labels are exactly want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		ok := true
		for _, l := range m.Label {
			if v, has := want[l.GetName()]; !has || v != l.GetValue() {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

const traceCall = `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"city":%q}%s}}`

// stateless is a 2026-07-28 tools/call, with more members in its _meta.
func stateless(id int, name, city, more string) string {
	return fmt.Sprintf(traceCall, id, name, city, `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",`+
		`"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}`+more+`}`)
}

// TestObservability drives a real `capgate serve` (metrics on their own
// listener, traces to an OTLP receiver, JSON logs) with calls that are
// allowed, denied and failing upstream, on the fast call and on mcp-go's
// path, then scrapes /metrics, reads the spans and the log.
func TestObservability(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	rc := startReceiver(t)
	metricsAddr := testkit.FreeAddr(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{
		Config: fmt.Sprintf(`metrics_listen = %q

[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.wx.get_weather"]

[mcp.servers.wx]
url = %q
`, metricsAddr, up.URL+"/mcp"),
		Env:  []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="},
		Args: []string{"--log-format", "json"},
	})
	if !strings.Contains(cg.Banner, "metrics         http://"+metricsAddr+"/metrics") {
		t.Fatalf("the banner does not name the metrics endpoint:\n%s", cg.Banner)
	}
	const argMarker = "ARG-MARKER-7f3a"
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatID: "TOKEN-MARKER-19c2"})

	// A client's trace: its span is the parent of capgate's server span.
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	meta := `,"traceparent":"00-` + clientTrace + `-` + clientSpan + `-01"`

	// Allowed, on the fast call (stateless 2026-07-28).
	status, _, body := testkit.PostMCP(t, cg.URL, tok, "wx__get_weather", stateless(1, "wx__get_weather", argMarker, meta))
	if status != 200 || !strings.Contains(string(body), "sunny in "+argMarker) {
		t.Fatalf("allowed call: %d %s", status, body)
	}
	// Allowed, through mcp-go (a session whose client can be asked for
	// sampling is not the fast call's).
	sid := testkit.OpenSession(t, cg.URL, tok, `{"sampling":{}}`)
	status, _, body = testkit.PostSession(t, cg.URL, tok, sid, fmt.Sprintf(traceCall, 2, "wx__get_weather", "Oslo", ""))
	if status != 200 || !strings.Contains(string(body), "sunny in Oslo") {
		t.Fatalf("allowed call in a session: %d %s", status, body)
	}
	// Denied: a tool the caller may see but not call.
	status, _, body = testkit.PostMCP(t, cg.URL, tok, "wx__forecast", stateless(3, "wx__forecast", "x", ""))
	if status != 200 || !strings.Contains(string(body), "permission_denied") {
		t.Fatalf("denied call: %d %s", status, body)
	}
	// An unknown tool's name never becomes a label. Its call is in a
	// trace of its own, to find its span.
	const unknownTrace = "5cf92f3577b34da6a3ce929d0e0e4799"
	testkit.PostMCP(t, cg.URL, tok, "no_such_tool_4711", stateless(4, "no_such_tool_4711", "x", `,"traceparent":"00-`+unknownTrace+`-`+clientSpan+`-01"`))
	// A refused token: logged with its reason, never the token.
	expired := cg.Token(t, token.Claims{Sub: "alice", IssuedAt: time.Now().Add(-2 * time.Hour), ExpiresAt: time.Now().Add(-time.Hour)})
	if status, _, _ := testkit.PostMCP(t, cg.URL, expired, "wx__get_weather", stateless(5, "wx__get_weather", "x", "")); status != http.StatusUnauthorized {
		t.Errorf("expired token: %d, want 401", status)
	}

	// The spans: the server span under the client's, the gates and the
	// upstream call under it, and the upstream saw the same trace.
	// The server span ends last, and may be exported in a batch of its own.
	spans := rc.waitFor(t, clientTrace, "tools/call get_weather", "tools/call wx__get_weather")
	var server *tracepb.Span
	for _, s := range spans {
		if s.Name == "tools/call wx__get_weather" && s.Kind == tracepb.Span_SPAN_KIND_SERVER {
			server = s
		}
	}
	if server == nil {
		t.Fatalf("no server span tools/call wx__get_weather in %d spans", len(spans))
	}
	if hex.EncodeToString(server.ParentSpanId) != clientSpan {
		t.Errorf("server span's parent %x, want the client's %s", server.ParentSpanId, clientSpan)
	}
	for k, want := range map[string]string{"mcp.method.name": "tools/call", "gen_ai.tool.name": "wx__get_weather",
		"jsonrpc.request.id": "1", "mcp.protocol.version": "2026-07-28", "network.transport": "tcp"} {
		if got := spanAttr(server, k); got != want {
			t.Errorf("server span %s = %q, want %q", k, got, want)
		}
	}
	children := map[string]*tracepb.Span{}
	for _, s := range spans {
		if string(s.ParentSpanId) == string(server.SpanId) {
			children[s.Name] = s
		}
	}
	for _, name := range []string{"gate resolve", "gate capability", "gate acknowledge", "gate chat_policy", "gate auth", "gate input", "gate rate_limit", "tools/call get_weather"} {
		if children[name] == nil {
			t.Errorf("no child span %q of the server span; children: %v", name, keys(children))
		}
	}
	if c := children["tools/call get_weather"]; c != nil && c.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("the upstream span is of kind %v, want client", c.Kind)
	}
	// The client span names the server it calls (semantic conventions:
	// server.address and server.port).
	upURL, _ := url.Parse(up.URL)
	if c := children["tools/call get_weather"]; c != nil {
		if got := spanAttr(c, "server.address"); got != upURL.Hostname() {
			t.Errorf("the upstream span's server.address %q, want %q", got, upURL.Hostname())
		}
		if got := spanIntAttr(c, "server.port"); fmt.Sprint(got) != upURL.Port() {
			t.Errorf("the upstream span's server.port %d, want %s", got, upURL.Port())
		}
	}
	// The unknown tool's span failed, as capability_not_found.
	for _, s := range rc.waitFor(t, unknownTrace, "tools/call other") {
		if s.Name == "tools/call other" && (s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || spanAttr(s, "error.type") != "capability_not_found") {
			t.Errorf("the unknown tool's span: status %v, error.type %q; want an error, capability_not_found", s.Status, spanAttr(s, "error.type"))
		}
	}
	headers, metas := up.seen()
	if len(headers) < 1 || len(metas) < 1 {
		t.Fatalf("the upstream saw %d headers and %d _meta", len(headers), len(metas))
	}
	upSpan := children["tools/call get_weather"]
	for what, tp := range map[string]string{"traceparent header": headers[0], "_meta traceparent": metas[0]} {
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != clientTrace {
			t.Errorf("the upstream's %s %q is not in the client's trace %s", what, tp, clientTrace)
		} else if upSpan != nil && parts[2] != hex.EncodeToString(upSpan.SpanId) {
			t.Errorf("the upstream's %s %q does not name the upstream call's span %x", what, tp, upSpan.SpanId)
		}
	}
	// The call through mcp-go's path (a job, in a context of its own) has
	// its gates under its own server span too.
	var sessionServer *tracepb.Span
	rc.mu.Lock()
	for _, s := range rc.spans {
		if s.Name == "tools/call wx__get_weather" && spanAttr(s, "mcp.session.id") == sid {
			sessionServer = s
		}
	}
	var sessionGates int
	for _, s := range rc.spans {
		if sessionServer != nil && string(s.ParentSpanId) == string(sessionServer.SpanId) && strings.HasPrefix(s.Name, "gate ") {
			sessionGates++
		}
	}
	rc.mu.Unlock()
	if sessionServer == nil || sessionGates < 6 {
		t.Errorf("the session's call: server span %v, %d gate spans under it", sessionServer != nil, sessionGates)
	}

	// Every source listed its tools.
	fams := scrape(t, "http://"+metricsAddr+"/metrics")
	if m := series(fams, "capgate_sources", map[string]string{}); m.GetGauge().GetValue() != 1 {
		t.Errorf("sources: %v", m)
	}
	if m := series(fams, "capgate_sources_available", map[string]string{}); m.GetGauge().GetValue() != 1 {
		t.Errorf("sources available: %v", m)
	}

	checkRPCObservability(t, cg.URL, "http://"+metricsAddr+"/metrics", tok, rc)

	// Failing upstream: the upstream is gone.
	up.CloseClientConnections()
	up.Close()
	status, _, body = testkit.PostMCP(t, cg.URL, tok, "wx__get_weather", stateless(6, "wx__get_weather", "Rome", ""))
	if status != 200 || !strings.Contains(string(body), "capability_backend_unavailable") {
		t.Fatalf("call to a gone upstream: %d %s", status, body)
	}

	fams = scrape(t, "http://"+metricsAddr+"/metrics")
	count := func(labels map[string]string) uint64 {
		m := series(fams, "mcp_server_operation_duration_seconds", labels)
		if m == nil {
			return 0
		}
		return m.GetHistogram().GetSampleCount()
	}
	op := func(tool, errType string) map[string]string {
		return map[string]string{"mcp_method_name": "tools/call", "gen_ai_tool_name": tool, "error_type": errType}
	}
	if n := count(op("wx__get_weather", "")); n != 2 {
		t.Errorf("successful calls of wx__get_weather: %d, want 2 (fast call and mcp-go)", n)
	}
	if n := count(op("wx__forecast", "permission_denied")); n != 1 {
		t.Errorf("calls of wx__forecast refused: %d, want 1", n)
	}
	if n := count(op("wx__get_weather", "capability_backend_unavailable")); n != 1 {
		t.Errorf("calls to the gone upstream: %d, want 1", n)
	}
	if n := count(map[string]string{"mcp_method_name": "initialize", "gen_ai_tool_name": "", "error_type": ""}); n != 1 {
		t.Errorf("initialize: %d, want 1", n)
	}
	for _, m := range fams["mcp_server_operation_duration_seconds"].GetMetric() {
		for _, l := range m.Label {
			if strings.Contains(l.GetValue(), "no_such_tool") {
				t.Errorf("a caller's tool name became a label: %v", m.Label)
			}
		}
	}
	if n := count(op("other", "capability_not_found")); n != 1 {
		t.Errorf("calls of an unknown tool counted as other, capability_not_found: %d, want 1", n)
	}
	if n := count(op("other", "")); n != 0 {
		t.Errorf("calls of an unknown tool counted as successes: %d", n)
	}
	if m := series(fams, "capgate_denials_total", map[string]string{"code": "permission_denied", "gate": "capability"}); m.GetCounter().GetValue() != 2 {
		t.Errorf("denials by the capability gate (one over /mcp, one over /rpc): %v", m)
	}
	if m := series(fams, "capgate_upstream_errors_total", map[string]string{"source": "mcp:wx"}); m.GetCounter().GetValue() != 1 {
		t.Errorf("upstream errors of mcp:wx: %v", m)
	}
	if m := series(fams, "capgate_calls_in_flight", map[string]string{}); m == nil || m.GetGauge().GetValue() != 0 {
		t.Errorf("calls in flight: %v", m)
	}
	// The lost upstream fails its next listing: no source is available.
	var avail *dto.Metric
	if !testkit.Poll(10*time.Second, func() bool {
		avail = series(scrape(t, "http://"+metricsAddr+"/metrics"), "capgate_sources_available", map[string]string{})
		return avail.GetGauge().GetValue() == 0
	}) {
		t.Errorf("sources available after the upstream is gone: %v", avail)
	}

	// The log: one JSON line per call, none with the argument or the
	// token; the 401 with its reason. Serve gathers log lines for up to
	// 100 ms before it writes them.
	var logs string
	testkit.Poll(10*time.Second, func() bool {
		logs = cg.Logs()
		return strings.Count(logs, `"msg":"call"`) >= 5 && strings.Contains(logs, `"msg":"token refused"`)
	})
	if strings.Contains(logs, argMarker) || strings.Contains(logs, "TOKEN-MARKER") || strings.Contains(logs, tok) || strings.Contains(logs, expired) {
		t.Errorf("the log holds an argument, a claim or a token:\n%s", logs)
	}
	var calls []map[string]any
	expiredLogged := false
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			t.Errorf("a log line is not JSON: %s", sc.Text())
			continue
		}
		switch line["msg"] {
		case "call":
			calls = append(calls, line)
		case "token refused":
			expiredLogged = expiredLogged || line["reason"] == "expired"
		}
	}
	if !expiredLogged {
		t.Errorf("no log line says the token expired:\n%s", logs)
	}
	var allowed, denied int
	for _, c := range calls {
		if c["sub"] != "alice" || c["duration_ms"] == nil || c["request_id"] == "" {
			t.Errorf("call line without sub, duration or request id: %v", c)
		}
		switch {
		case c["tool"] == "wx__get_weather" && c["decision"] == "allow" && c["code"] == "":
			allowed++
		case c["tool"] == "wx__forecast" && c["decision"] == "deny" && c["code"] == "permission_denied" && c["gate"] == "capability":
			denied++
		}
	}
	if allowed != 3 || denied != 2 { // /mcp: 2 allowed, 1 denied; /rpc: 1 and 1
		t.Errorf("call lines: %d allowed, %d denied (want 3, 2):\n%v", allowed, denied, calls)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
