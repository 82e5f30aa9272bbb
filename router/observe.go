package router

import "context"

// Metrics counts calls by outcome; *telemetry.Metrics implements it. nil
// is off.
type Metrics interface {
	CallStarted()
	CallDone()
	Denied(code, gate string)
	UpstreamError(source string)
	SandboxDenied(source string)
}

// Tracer makes a call's spans: one per gate and one for the call to the
// upstream. app adapts *telemetry.Tracer to it; nil is off.
type Tracer interface {
	Gate(ctx context.Context, gate string) Span
	Upstream(ctx context.Context, name, id, kind, source string) (context.Context, Span)
}

// Span ends with the outcome of what it timed: a stable error code, or ""
// when it succeeded.
type Span interface{ End(errorType string) }

// noMetrics and noTracer stand in for nil, so that the call path needs no
// checks; their values are zero-size and cost no allocation.
type (
	noMetrics struct{}
	noTracer  struct{}
	noSpan    struct{}
)

func (noMetrics) CallStarted()          {}
func (noMetrics) CallDone()             {}
func (noMetrics) Denied(string, string) {}
func (noMetrics) UpstreamError(string)  {}
func (noMetrics) SandboxDenied(string)  {}

func (noTracer) Gate(context.Context, string) Span { return noSpan{} }
func (noTracer) Upstream(ctx context.Context, _, _, _, _ string) (context.Context, Span) {
	return ctx, noSpan{}
}

func (noSpan) End(string) {}
