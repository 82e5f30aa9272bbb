package mcp

import (
	"context"
	"net/http"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/telemetry"
)

// Trace context travels to an upstream twice, as the MCP semantic
// conventions ask: in the HTTP request's traceparent and tracestate
// headers, and in the request's params._meta. With tracing off the
// context carries no span and nothing is added.

// traced is req, or when its context has a span a copy of it carrying
// the trace context in its headers: the request is not changed, since a
// request made from a template shares its header map.
func traced(req *http.Request) *http.Request {
	tp, ts, ok := telemetry.TraceParent(req.Context())
	if !ok {
		return req
	}
	req = req.WithContext(req.Context())
	req.Header = req.Header.Clone()
	req.Header.Set("traceparent", tp)
	if ts != "" {
		req.Header.Set("tracestate", ts)
	}
	return req
}

// appendTraceMeta appends a trace context (telemetry.TraceParent's) as
// members of a _meta object being written (after a first member when more
// is true); with no traceparent, nothing.
func appendTraceMeta(b []byte, tp, ts string, more bool) []byte {
	if tp == "" {
		return b
	}
	if more {
		b = append(b, ',')
	}
	b = append(b, `"traceparent":"`...)
	b = append(b, tp...)
	b = append(b, '"')
	if ts != "" {
		b = append(b, `,"tracestate":`...)
		b = rawjson.AppendString(b, ts)
	}
	return b
}

// traceMeta puts ctx's trace context in an mcp-go request's _meta.
func traceMeta(ctx context.Context, meta **mcpgo.Meta) {
	tp, ts, ok := telemetry.TraceParent(ctx)
	if !ok {
		return
	}
	if *meta == nil {
		*meta = &mcpgo.Meta{}
	}
	if (*meta).AdditionalFields == nil {
		(*meta).AdditionalFields = map[string]any{}
	}
	(*meta).AdditionalFields["traceparent"] = tp
	if ts != "" {
		(*meta).AdditionalFields["tracestate"] = ts
	}
}
