// Package telemetry is what capgate tells an operator about its traffic:
// Prometheus metrics (on their own registry, never the global one) and
// OpenTelemetry traces (OTLP, configured by the standard OTEL_*
// environment variables). It imports nothing of the module; the front
// door and the router call its nil-safe hooks, and app builds it. A nil
// *Metrics or *Tracer is off and costs a nil check.
package telemetry

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metric names. The first two are the OpenTelemetry semantic conventions'
// mcp.server.operation.duration and rpc.server.call.duration (the
// capability RPC's requests), as Prometheus spells them.
const (
	MetricOperationDuration = "mcp_server_operation_duration_seconds"
	MetricRPCCallDuration   = "rpc_server_call_duration_seconds"
	MetricDenials           = "capgate_denials_total"
	MetricUpstreamErrors    = "capgate_upstream_errors_total"
	MetricSandboxDenials    = "capgate_sandbox_denials_total"
	MetricSourcesAvailable  = "capgate_sources_available"
	MetricSources           = "capgate_sources"
	MetricCallsInFlight     = "capgate_calls_in_flight"
	MetricSessions          = "capgate_mcp_sessions"
)

// durationBuckets are the semantic conventions' advice for
// mcp.server.operation.duration, in seconds.
var durationBuckets = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}

// Metrics are capgate's Prometheus metrics, on a registry of their own.
type Metrics struct {
	reg        *prometheus.Registry
	opDuration *prometheus.HistogramVec
	rpcCalls   *prometheus.HistogramVec
	denials    *prometheus.CounterVec
	upstream   *prometheus.CounterVec
	sandbox    *prometheus.CounterVec
	inFlight   prometheus.Gauge
}

// MetricsOptions are the gauges read when scraped.
type MetricsOptions struct {
	// Sources says how many tool sources listed their tools at the last
	// refresh, and how many there are. nil: the gauges are not exported.
	Sources func() (available, total int)
	// Sessions says how many MCP sessions are held. nil: not exported.
	Sessions func() int
}

// NewMetrics makes the metrics and their registry.
func NewMetrics(o MetricsOptions) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricOperationDuration,
			Help:    "Duration of MCP requests as the server saw them (mcp.server.operation.duration). gen_ai_tool_name is an exposed tool name or \"other\"; error_type is empty on success, else the stable error code (tool_error when the tool reported an error).",
			Buckets: durationBuckets,
		}, []string{"mcp_method_name", "gen_ai_tool_name", "error_type"}),
		rpcCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricRPCCallDuration,
			Help:    "Duration of capability RPC requests (POST /rpc) as the server saw them (rpc.server.call.duration). rpc_method is a method of the RPC or \"other\"; gen_ai_tool_name and error_type are as in " + MetricOperationDuration + ".",
			Buckets: durationBuckets,
		}, []string{"rpc_method", "gen_ai_tool_name", "error_type"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDenials,
			Help: "Tool calls refused or failed, by stable error code and the gate that refused them.",
		}, []string{"code", "gate"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamErrors,
			Help: "Tool calls whose source failed to answer (transport, timeout, protocol), by source (kind:name).",
		}, []string{"source"}),
		sandbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricSandboxDenials,
			Help: "Tool calls not run because their sandbox could not be enforced, by source (kind:name).",
		}, []string{"source"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricCallsInFlight,
			Help: "Tool calls inside the router now, from every front door.",
		}),
	}
	m.reg.MustRegister(m.opDuration, m.rpcCalls, m.denials, m.upstream, m.sandbox, m.inFlight)
	if o.Sources != nil {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricSourcesAvailable,
				Help: "Tool sources whose last listing succeeded."},
				func() float64 { up, _ := o.Sources(); return float64(up) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricSources,
				Help: "Tool sources configured."},
				func() float64 { _, n := o.Sources(); return float64(n) }))
	}
	if o.Sessions != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricSessions,
			Help: "MCP sessions (protocol 2025-11-25) held: bounded by [server] max_sessions, idle ones forgotten."},
			func() float64 { return float64(o.Sessions()) }))
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Operation records one MCP request.
func (m *Metrics) Operation(method, toolName, errorType string, d time.Duration) {
	if m == nil {
		return
	}
	m.opDuration.WithLabelValues(method, toolName, errorType).Observe(d.Seconds())
}

// rpcCall records one capability RPC request.
func (m *Metrics) rpcCall(method, toolName, errorType string, d time.Duration) {
	if m == nil {
		return
	}
	m.rpcCalls.WithLabelValues(method, toolName, errorType).Observe(d.Seconds())
}

// CallStarted and CallDone bracket one tool call in the router.
func (m *Metrics) CallStarted() {
	if m != nil {
		m.inFlight.Inc()
	}
}

func (m *Metrics) CallDone() {
	if m != nil {
		m.inFlight.Dec()
	}
}

// Denied counts a call refused (or failed) with code by gate.
func (m *Metrics) Denied(code, gate string) {
	if m != nil {
		m.denials.WithLabelValues(code, gate).Inc()
	}
}

// UpstreamError counts a call its source failed to answer.
func (m *Metrics) UpstreamError(source string) {
	if m != nil {
		m.upstream.WithLabelValues(source).Inc()
	}
}

// SandboxDenied counts a call not run because its confinement could not
// be enforced, and a socket or new process the kernel refused a confined
// tool (seen through seccomp user notification).
func (m *Metrics) SandboxDenied(source string) {
	if m != nil {
		m.sandbox.WithLabelValues(source).Inc()
	}
}
