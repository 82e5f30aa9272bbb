package app

import (
	"context"
	"net/url"
	"strconv"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
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

// routerTracer's upstream spans name the server address and port of each
// upstream MCP server cfg reaches by URL.
func routerTracer(t *telemetry.Tracer, cfg *config.Config) router.Tracer {
	if t == nil {
		return nil
	}
	a := tracer{t: t, addrs: map[string]hostPort{}}
	for name, s := range cfg.MCP.Servers {
		if s == nil || s.URL == "" {
			continue
		}
		if u, err := url.Parse(s.URL); err == nil && u.Hostname() != "" {
			port, _ := strconv.Atoi(u.Port())
			if port == 0 {
				port = map[string]int{"http": 80, "https": 443}[u.Scheme]
			}
			a.addrs[name] = hostPort{u.Hostname(), port}
		}
	}
	return a
}

type hostPort struct {
	host string
	port int
}

type tracer struct {
	t     *telemetry.Tracer
	addrs map[string]hostPort // upstream MCP servers by source name
}

func (a tracer) Gate(ctx context.Context, gate string) router.Span { return a.t.Gate(ctx, gate) }

func (a tracer) Upstream(ctx context.Context, name, id, kind, source string) (context.Context, router.Span) {
	var hp hostPort
	if kind == string(tool.KindMCP) {
		hp = a.addrs[source]
	}
	return a.t.Upstream(ctx, name, id, kind, source, hp.host, hp.port)
}
