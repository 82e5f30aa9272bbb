package router

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// slowSource has one tool, mcp:slow:run, that counts its runs and blocks
// until release is closed (or its call's context ends).
type slowSource struct {
	runs    atomic.Int64
	started chan struct{}
	release chan struct{}
}

func (*slowSource) ID() string      { return "slow" }
func (*slowSource) Kind() tool.Kind { return tool.KindMCP }
func (*slowSource) List(context.Context) ([]*tool.Descriptor, error) {
	return []*tool.Descriptor{{ID: "mcp:slow:run", Kind: tool.KindMCP, Source: "slow", Name: "run", Available: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Risk: risk.Assessment{Level: risk.Low}}}, nil
}
func (s *slowSource) Call(ctx context.Context, c tool.Call) (*tool.Result, error) {
	s.runs.Add(1)
	if s.started != nil {
		s.started <- struct{}{}
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return tool.TextResult("ran"), nil
}

// leaseRouter is a router over src and st, with opts' idempotency settings.
func leaseRouter(t *testing.T, src tool.Source, st *store.Store, set func(*Options)) *Router {
	t.Helper()
	reg, err := registry.New(context.Background(), []tool.Source{src}, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	table, _ := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	opts := Options{Registry: reg, Risk: table, State: st,
		Policy: Policy{Anonymous: &Subject{Sub: "anon", Grants: []string{"rye.fetch.tool.mcp.slow.*", "rye.execute.tool.mcp.slow.*", "rye.fetch.tool.mcp.cnt.*", "rye.execute.tool.mcp.cnt.*"}}}}
	if set != nil {
		set(&opts)
	}
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func leaseStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "data"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func slowCall(r *Router, key string) (*tool.Result, error) {
	return r.Call(context.Background(), r.Anonymous(), Request{Tool: "mcp:slow:run", ByID: true,
		Input: json.RawMessage(`{}`), IdempotencyKey: key})
}

// deadClaim claims key as a replica that then died would have: a lease
// of d that nobody renews.
func deadClaim(t *testing.T, st *store.Store, key string, d time.Duration) {
	t.Helper()
	_, _, hash, err := parseInput(json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if claim, _, err := st.ClaimIdempotency(context.Background(), "anon", "mcp:slow:run", key, hash, d, time.Hour); err != nil || claim == "" {
		t.Fatalf("claim: %q %v", claim, err)
	}
}

// TestKeyHonouredForEveryTool: issue 24 item 10. A tool capgate does not
// count as mutating (no side effects declared) runs once per key too.
func TestKeyHonouredForEveryTool(t *testing.T) {
	src := &countSource{}
	r := leaseRouter(t, src, leaseStore(t), nil)
	for i := range 20 {
		if err := callTool(r, "plain", "one-key"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := src.calls.Load(); n != 1 {
		t.Errorf("20 calls with one key to a tool not counted as mutating ran it %d times, want 1", n)
	}
}

// TestDeadClaimIsNotRunAgain: a key whose claim's holder stopped renewing
// (its replica died) is answered, promptly and on every retry, that the
// first call's outcome is unknown; the tool does not run.
func TestDeadClaimIsNotRunAgain(t *testing.T) {
	st := leaseStore(t)
	src := &slowSource{release: make(chan struct{})}
	close(src.release)
	r := leaseRouter(t, src, st, func(o *Options) { o.IdempotencyLease, o.IdempotencyWait = 200*time.Millisecond, 2*time.Second })
	deadClaim(t, st, "k", 200*time.Millisecond)
	for i := range 3 {
		_, err := slowCall(r, "k")
		te := denied(t, err, tool.CodeBackendUnavailable, GateIdempotency)
		if te.Reason != ReasonOutcomeUnknown || te.RetryAfter != 0 {
			t.Fatalf("retry %d: reason %q, retry after %v", i, te.Reason, te.RetryAfter)
		}
	}
	if n := src.runs.Load(); n != 0 {
		t.Errorf("a key whose first call died ran %d times on retry, want 0", n)
	}
	// Another key runs.
	if _, err := slowCall(r, "k2"); err != nil || src.runs.Load() != 1 {
		t.Fatalf("a new key: %v, %d runs", err, src.runs.Load())
	}
}

// TestDeadClaimOfRepeatableToolRuns: a tool the operator declared
// repeatable runs again, once, and its result is then replayed.
func TestDeadClaimOfRepeatableToolRuns(t *testing.T) {
	st := leaseStore(t)
	src := &slowSource{release: make(chan struct{})}
	close(src.release)
	r := leaseRouter(t, src, st, func(o *Options) {
		o.IdempotencyLease, o.Repeatable = 200*time.Millisecond, []string{"mcp:slow:*"}
	})
	deadClaim(t, st, "k", time.Millisecond) // the first retry waits out its lease
	for i := range 3 {
		if _, err := slowCall(r, "k"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := src.runs.Load(); n != 1 {
		t.Errorf("a repeatable tool's dead key ran %d times over 3 retries, want 1", n)
	}
}

// TestInProgressAnswersPromptly: a retry while the first call runs (and
// renews its lease past several leases) waits at most IdempotencyWait and
// answers rate_limited with a RetryAfter; the first call then completes
// and the retry replays it.
func TestInProgressAnswersPromptly(t *testing.T) {
	st := leaseStore(t)
	src := &slowSource{started: make(chan struct{}, 1), release: make(chan struct{})}
	set := func(o *Options) { o.IdempotencyLease, o.IdempotencyWait = 450*time.Millisecond, 100*time.Millisecond }
	a, b := leaseRouter(t, src, st, set), leaseRouter(t, src, st, set)
	first := make(chan error, 1)
	go func() { _, err := slowCall(a, "k"); first <- err }()
	select {
	case <-src.started:
	case err := <-first:
		t.Fatalf("the first call ended before its tool ran: %v", err)
	}
	// Over two leases long: without renewals the claim would read as dead.
	for i := range 12 {
		_, err := slowCall(b, "k")
		te := denied(t, err, tool.CodeRateLimited, GateIdempotency)
		if te.Reason != ReasonInProgress || te.RetryAfter != 450*time.Millisecond || te.RetryAfterSeconds() != 1 {
			t.Fatalf("retry %d while the first runs: reason %q, retry after %v", i, te.Reason, te.RetryAfter)
		}
	}
	close(src.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if res, err := slowCall(b, "k"); err != nil || text(t, res) != "ran" {
		t.Fatalf("retry after the first call ended: %v", err)
	}
	if n := src.runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}
