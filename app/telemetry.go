package app

import (
	"context"

	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/telemetry"
)

// routerMetrics and routerTracer give the router the telemetry it
// observes calls with, through its own small interfaces, so that the
// router does not depend on Prometheus or the OTLP exporter; nil (off)
// stays nil.
func routerMetrics(m *telemetry.Metrics) router.Metrics {
	if m == nil {
		return nil
	}
	return m
}

func routerTracer(t *telemetry.Tracer) router.Tracer {
	if t == nil {
		return nil
	}
	return tracer{t}
}

type tracer struct{ t *telemetry.Tracer }

func (a tracer) Gate(ctx context.Context, gate string) router.Span { return a.t.Gate(ctx, gate) }

func (a tracer) Upstream(ctx context.Context, name, id, kind, source string) (context.Context, router.Span) {
	return a.t.Upstream(ctx, name, id, kind, source)
}
