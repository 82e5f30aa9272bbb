package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// noop is an in-process source whose one tool answers at once, so a
// benchmark measures the router and nothing else.
type noop struct{ result *tool.Result }

func (noop) ID() string      { return "bench" }
func (noop) Kind() tool.Kind { return tool.KindMCP }
func (noop) List(context.Context) ([]*tool.Descriptor, error) {
	return []*tool.Descriptor{{
		ID: tool.ID(tool.KindMCP, "bench", "noop"), Kind: tool.KindMCP, Source: "bench", Name: "noop",
		Description: "does nothing", Available: true,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`),
		Risk:        risk.Assessment{Level: risk.Low},
	}}, nil
}
func (n noop) Call(context.Context, tool.Call) (*tool.Result, error) { return n.result, nil }

func benchRouter(b testing.TB) (*Router, string) {
	b.Helper()
	ctx := context.Background()
	reg, err := registry.New(ctx, []tool.Source{noop{tool.TextResult(`{"ok":true}`)}}, registry.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { reg.Close() })
	dir := b.TempDir()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	log, err := audit.Open(filepath.Join(dir, "audit.jsonl"), audit.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { log.Close() })
	secret := []byte("bench-secret")
	v, _ := token.NewVerifier(token.Options{Secret: secret})
	table, _ := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	r, err := New(Options{Registry: reg, Verifier: v, Risk: table, State: st, Audit: log,
		// The caps are tier elevated: the policy acknowledges it.
		Policy: Policy{Grants: []string{"rye.fetch.*", "rye.execute.tool.mcp.bench.*"}, Acknowledge: []string{"elevated"}}})
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := token.Mint(secret, token.Claims{Sub: "alice", ChatType: "private",
		Caps: []string{"rye.fetch.tool.*", "rye.execute.tool.mcp.*"}}, token.MintOptions{Ash: true})
	return r, raw
}

// BenchmarkCall is the router's own cost per call on a no-op tool: every
// gate, schema validation, output hardening and two audit events.
func BenchmarkCall(b *testing.B) {
	r, raw := benchRouter(b)
	c, err := r.Authenticate(raw)
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Tool: "bench__noop", Input: json.RawMessage(`{"message":"hello"}`), Protocol: "bench"}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	for b.Loop() {
		if _, err := r.Call(ctx, c, req); err != nil {
			b.Fatal(err)
		}
	}
	// CPU, the audit writer's included, is steadier than ns/op on a busy machine.
	b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkAuthenticateAndCall adds verifying the token, as every HTTP
// request does.
func BenchmarkAuthenticateAndCall(b *testing.B) {
	r, raw := benchRouter(b)
	req := Request{Tool: "bench__noop", Input: json.RawMessage(`{"message":"hello"}`), Protocol: "bench"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, err := r.Authenticate(raw)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Call(ctx, c, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallLogged is BenchmarkCall with serve's text log on (to
// io.Discard): the one "call" line per call.
func BenchmarkCallLogged(b *testing.B) {
	r, raw := benchRouter(b)
	r.opts.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := r.Authenticate(raw)
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Tool: "bench__noop", Input: json.RawMessage(`{"message":"hello"}`), Protocol: "bench"}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	for b.Loop() {
		if _, err := r.Call(ctx, c, req); err != nil {
			b.Fatal(err)
		}
	}
	// CPU, the audit writer's included, is steadier than ns/op on a busy machine.
	b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkObserve is the "call" log line alone, as serve's text handler
// writes it (to io.Discard).
func BenchmarkObserve(b *testing.B) {
	r := &Router{opts: Options{Metrics: noMetrics{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))}}
	ev := &audit.Event{Sub: "bench", ToolName: "echo", Decision: "allow", Duration: 412 * time.Microsecond,
		RequestID: "cap_0123456789abcdef01234567"}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	for b.Loop() {
		r.observe(ctx, ev)
	}
	b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}
