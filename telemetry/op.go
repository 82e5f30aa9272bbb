package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Other stands for a method or tool name that is not one capgate serves:
// labels and span names carry only names from a bounded set.
const Other = "other"

// ToolError is the error type of a call whose tool answered with
// isError, as the semantic conventions name it.
const ToolError = "tool_error"

// methods are the MCP methods a label may name.
var methods = map[string]bool{
	"initialize": true, "ping": true, "tools/list": true, "tools/call": true,
	"prompts/list": true, "prompts/get": true, "resources/list": true, "resources/templates/list": true,
	"resources/read": true, "resources/subscribe": true, "resources/unsubscribe": true,
	"completion/complete": true, "logging/setLevel": true, "notifications/initialized": true,
	"notifications/cancelled": true, "notifications/progress": true, "notifications/roots/list_changed": true,
	"tasks/get": true, "tasks/list": true, "tasks/cancel": true, "tasks/result": true,
}

// Method is m when it is an MCP method, else Other.
func Method(m string) string {
	if methods[m] {
		return m
	}
	return Other
}

// Request is what the front door read of one MCP request. Tool is an
// exposed tool name or Other (the caller's own words never become a
// label); the trace parent comes from params._meta, else the HTTP
// headers.
type Request struct {
	Method, Tool                              string
	ID, SessionID, ProtocolVersion, Transport string
	TraceParent, TraceState                   string
}

// RPCRequest is what the capability RPC read of one request. Method is
// one of its methods or Other; Tool, for a call, the exposed name of the
// tool it names, or Other when capgate serves no such tool (the caller's
// own words never become a label), and ToolID that tool's id. The trace
// parent comes from the HTTP headers.
type RPCRequest struct {
	Method, Tool, ToolID, ID, Transport string
	TraceParent, TraceState             string
}

// Op is one MCP or capability RPC request being served: its duration
// goes to the histogram, its span to the tracer.
type Op struct {
	m         *Metrics
	rpc       bool // capability RPC: rpc_server_call_duration_seconds
	start     time.Time
	method    string
	tool      string
	errorType atomic.Pointer[string] // set by the call, which may outlive the request (a parked job)
	span      Span
}

type opKey struct{}

// WithOp returns ctx carrying op.
func WithOp(ctx context.Context, op *Op) context.Context { return context.WithValue(ctx, opKey{}, op) }

// OpFrom returns the Op ctx carries, or nil.
func OpFrom(ctx context.Context) *Op {
	op, _ := ctx.Value(opKey{}).(*Op)
	return op
}

// Begin starts timing (and with a tracer, the server span of) one MCP
// request; the returned ctx carries both. End it with End.
func Begin(ctx context.Context, m *Metrics, t *Tracer, r Request) (context.Context, *Op) {
	op := &Op{m: m, start: time.Now(), method: r.Method, tool: r.Tool}
	if t != nil {
		name := r.Method
		attrs := []attribute.KeyValue{attribute.String("mcp.method.name", r.Method),
			attribute.String("network.protocol.name", "http"), attribute.String("jsonrpc.protocol.version", "2.0")}
		if r.Tool != "" {
			name += " " + r.Tool
			attrs = append(attrs, attribute.String("gen_ai.tool.name", r.Tool), attribute.String("gen_ai.operation.name", "execute_tool"))
		}
		for _, kv := range [...]struct{ k, v string }{{"jsonrpc.request.id", r.ID}, {"mcp.session.id", r.SessionID},
			{"mcp.protocol.version", r.ProtocolVersion}, {"network.transport", r.Transport}} {
			if kv.v != "" {
				attrs = append(attrs, attribute.String(kv.k, kv.v))
			}
		}
		ctx = extract(ctx, r.TraceParent, r.TraceState)
		ctx, op.span = t.Start(ctx, name, trace.SpanKindServer, attrs...)
	}
	return WithOp(ctx, op), op
}

// BeginRPC is Begin for one capability RPC request (POST /rpc): a server
// span "{rpc.method} {tool}" with the MCP call's tool attributes, timed
// into rpc_server_call_duration_seconds.
func BeginRPC(ctx context.Context, m *Metrics, t *Tracer, r RPCRequest) (context.Context, *Op) {
	op := &Op{m: m, rpc: true, start: time.Now(), method: r.Method, tool: r.Tool}
	if t != nil {
		name := r.Method
		attrs := []attribute.KeyValue{attribute.String("rpc.system.name", "jsonrpc"), attribute.String("rpc.method", r.Method),
			attribute.String("network.protocol.name", "http"), attribute.String("jsonrpc.protocol.version", "2.0")}
		if r.Tool != "" {
			name += " " + r.Tool
			attrs = append(attrs, attribute.String("gen_ai.tool.name", r.Tool), attribute.String("gen_ai.operation.name", "execute_tool"))
		}
		for _, kv := range [...]struct{ k, v string }{{"capgate.tool.id", r.ToolID}, {"jsonrpc.request.id", r.ID},
			{"network.transport", r.Transport}} {
			if kv.v != "" {
				attrs = append(attrs, attribute.String(kv.k, kv.v))
			}
		}
		ctx = extract(ctx, r.TraceParent, r.TraceState)
		ctx, op.span = t.Start(ctx, name, trace.SpanKindServer, attrs...)
	}
	return WithOp(ctx, op), op
}

// Fail records the request's outcome: a stable error code, or ToolError.
func (o *Op) Fail(errorType string) {
	if o != nil {
		o.errorType.Store(&errorType)
	}
}

// End records the request's duration and ends its span.
func (o *Op) End() {
	if o == nil {
		return
	}
	errorType := ""
	if e := o.errorType.Load(); e != nil {
		errorType = *e
	}
	if o.rpc {
		o.m.rpcCall(o.method, o.tool, errorType, time.Since(o.start))
	} else {
		o.m.Operation(o.method, o.tool, errorType, time.Since(o.start))
	}
	o.span.End(errorType)
}
