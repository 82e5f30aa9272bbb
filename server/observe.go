package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
)

// Observing the front door: every MCP request (a POST to /mcp, fast call
// or mcp-go alike) is timed into mcp_server_operation_duration_seconds
// and, with a tracer, served inside a span "{method} {tool}" whose parent
// is the client's params._meta traceparent (else its HTTP header). The
// router's gates and the upstream call are its children. With neither
// metrics nor tracer nothing here runs.

var (
	opParams = []string{"name", "_meta"}
	opMeta   = []string{"traceparent", "tracestate"}
)

// observed says whether the front door records anything.
func (m *MCP) observed() bool { return m.metrics != nil || m.tracer != nil }

// begin reads what the op needs of one POSTed body and starts it; nil
// when the body is not a request (a client's response, a batch, garbage
// is still counted, as method "other").
func (m *MCP) begin(r *http.Request, body *posted) (*http.Request, *telemetry.Op) {
	var params [2][]byte
	var meta [2][]byte
	req := telemetry.Request{Method: telemetry.Other, SessionID: r.Header.Get(mcpserver.HeaderKeySessionID),
		ProtocolVersion: r.Header.Get(mcp.HeaderProtocolVersion),
		TraceParent:     r.Header.Get("traceparent"), TraceState: r.Header.Get("tracestate")}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		req.Transport = a.Network()
	}
	if top, ok := body.members(); ok {
		if top[2] == nil {
			return r, nil // a response to something capgate asked
		}
		method, _ := plainString(top[2])
		req.Method = telemetry.Method(method)
		req.ID = strings.Trim(string(top[1]), `"`)
		if rawjson.Pick(top[3], opParams, params[:]) {
			if req.Method == "tools/call" {
				req.Tool = m.toolLabel(params[0])
			}
			if params[1] != nil && rawjson.Pick(params[1], opMeta, meta[:]) && meta[0] != nil {
				req.TraceParent, _ = plainString(meta[0])
				req.TraceState, _ = plainString(meta[1])
			}
		}
	}
	ctx, op := telemetry.Begin(r.Context(), m.metrics, m.tracer, req)
	return r.WithContext(ctx), op
}

// toolLabel is the tool a tools/call names, when it is one capgate
// exposes; else telemetry.Other, so labels stay bounded.
func (m *MCP) toolLabel(raw []byte) string {
	name, ok := plainString(raw)
	if !ok {
		return telemetry.Other
	}
	if name == UseSkill {
		return name
	}
	if _, ok := m.reg().Snapshot().ByExposedName(name); ok {
		return name
	}
	return telemetry.Other
}

// exposedName is the name MCP clients see of the tool id names, when
// capgate serves it: /rpc's label for the tool it calls.
func (m *MCP) exposedName(id string) (string, bool) {
	d, ok := m.reg().Snapshot().Lookup(id)
	if !ok {
		return "", false
	}
	return d.ExposedName, true
}

// outcome is a call's error type: its stable code, tool_error when the
// tool answered with isError, "" when it succeeded.
func outcome(isError bool, err error) string {
	switch {
	case err != nil:
		return string(tool.ErrorCode(err))
	case isError:
		return telemetry.ToolError
	}
	return ""
}

// serveMetrics serves GET /metrics on ln, without a token, until ctx
// ends.
func (s *Server) serveMetrics(ctx context.Context, ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics.Handler())
	// The same DNS-rebinding check as the front door: the metrics name
	// every exposed tool, so a page rebound to 127.0.0.1 must not read them.
	srv := s.newHTTPServer(rejectRebinding(mux), nil)
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.logger.Error("metrics listener failed", "addr", ln.Addr().String(), "err", err)
	}
}
