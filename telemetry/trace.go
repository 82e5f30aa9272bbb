package telemetry

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Span names beyond the per-request "{mcp.method.name} {target}": the
// router's gates are "gate <name>" and the call to a source is
// "tools/call <upstream tool name>" (kind client).
const (
	SpanGatePrefix  = "gate "
	instrumentation = "github.com/capgate/capgate"
)

// Tracer makes capgate's spans and exports them over OTLP/HTTP.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

// propagator is W3C trace context: traceparent and tracestate.
var propagator = propagation.TraceContext{}

// NewTracer returns the tracer the environment asks for, or nil (tracing
// off, costing nothing) when it asks for none. Tracing is on when
// OTEL_TRACES_EXPORTER is "otlp", or when it is unset and
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off.
// The exporter reads the rest of OTEL_EXPORTER_OTLP_* itself; only the
// http/protobuf protocol is built in. version is capgate's, for the
// resource.
func NewTracer(ctx context.Context, lookupEnv func(string) (string, bool), version string) (*Tracer, error) {
	get := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	switch exp := get("OTEL_TRACES_EXPORTER"); exp {
	case "none":
		return nil, nil
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: capgate exports traces with otlp only (or none)", exp)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := get(k); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("%s=%q: capgate exports OTLP over http/protobuf only", k, p)
			}
			break
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("capgate"), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracer{tp: tp, tracer: tp.Tracer(instrumentation, trace.WithInstrumentationVersion(version))}, nil
}

// Shutdown exports what is buffered and stops.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Span is a span that ends with the call's outcome; its zero value (what
// a nil Tracer starts) does nothing.
type Span struct{ s trace.Span }

// Start starts a span as a child of the one ctx carries.
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx, s := t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return ctx, Span{s}
}

// Gate starts the span of one router gate.
func (t *Tracer) Gate(ctx context.Context, gate string) Span {
	if t == nil {
		return Span{}
	}
	_, s := t.tracer.Start(ctx, SpanGatePrefix+gate, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("capgate.gate", gate)))
	return Span{s}
}

// SetAttributes adds attributes to the span.
func (s Span) SetAttributes(attrs ...attribute.KeyValue) {
	if s.s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// End ends the span; a non-empty errorType (a stable error code) marks it
// failed, as error.type.
func (s Span) End(errorType string) {
	if s.s == nil {
		return
	}
	if errorType != "" {
		s.s.SetAttributes(attribute.String("error.type", errorType))
		s.s.SetStatus(codes.Error, errorType)
	}
	s.s.End()
}

// Carry gives to the span ctx from carries, for work that runs in a
// context of its own (a job) but belongs to from's request.
func Carry(from, to context.Context) context.Context {
	if s := trace.SpanFromContext(from); s.SpanContext().IsValid() {
		to = trace.ContextWithSpan(to, s)
	}
	if op := OpFrom(from); op != nil {
		to = WithOp(to, op)
	}
	return to
}

// TraceParent is the W3C traceparent (and tracestate) of the span ctx
// carries, for an upstream request; ok is false when ctx carries none,
// which is always the case with tracing off.
func TraceParent(ctx context.Context) (traceparent, tracestate string, ok bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", "", false
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"], c["tracestate"], c["traceparent"] != ""
}

// extract reads a remote parent from traceparent and tracestate.
func extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return propagator.Extract(ctx, c)
}

// Upstream starts the client span of a call to a source: named after the
// method and the tool's name upstream, with the server's address and port
// when the source is reached over the network (host "": a subprocess).
// The source is named kind:source; both are taken apart so that a nil
// tracer costs no concatenation.
func (t *Tracer) Upstream(ctx context.Context, name, id, kind, source, host string, port int) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	attrs := []attribute.KeyValue{attribute.String("mcp.method.name", "tools/call"),
		attribute.String("gen_ai.tool.name", name), attribute.String("capgate.tool.id", id), attribute.String("capgate.source", kind+":"+source)}
	if host != "" {
		attrs = append(attrs, attribute.String("server.address", host), attribute.Int("server.port", port))
	}
	return t.Start(ctx, "tools/call "+name, trace.SpanKindClient, attrs...)
}
