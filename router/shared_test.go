package router

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// countSource is an in-process source of tools that counts the calls it
// runs: plain (reads), write (mutating), danger (CRITICAL: approval) and
// linked (needs a linked account).
type countSource struct{ calls atomic.Int64 }

func (*countSource) ID() string      { return "cnt" }
func (*countSource) Kind() tool.Kind { return tool.KindMCP }
func (*countSource) List(context.Context) ([]*tool.Descriptor, error) {
	var out []*tool.Descriptor
	for _, n := range []string{"plain", "write", "danger", "linked"} {
		level := risk.Low
		if n == "danger" {
			level = risk.Critical
		}
		out = append(out, &tool.Descriptor{ID: tool.ID(tool.KindMCP, "cnt", n), Kind: tool.KindMCP, Source: "cnt",
			Name: n, Available: true, InputSchema: json.RawMessage(`{"type":"object"}`),
			Risk: risk.Assessment{Level: level}, Mutating: n == "write", RequiresAuth: n == "linked"})
	}
	return out, nil
}
func (s *countSource) Call(_ context.Context, c tool.Call) (*tool.Result, error) {
	s.calls.Add(1)
	return tool.TextResult(c.Tool.ID), nil
}

// sharedStore opens a store on the PostgreSQL database at url, as a
// replica does.
func sharedStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), "", store.Options{URL: url, Key: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// replica is a router over src and st, as one capgate serve would be.
func replica(t *testing.T, src *countSource, st *store.Store, rl RateLimit) *Router {
	t.Helper()
	return leaseRouter(t, src, st, func(o *Options) {
		o.Policy.RateLimit = rl
		if st.Shared() {
			o.RateBuckets = st // as app wires it
		}
	})
}

func callTool(r *Router, name, key string) error {
	_, err := r.Call(context.Background(), r.Anonymous(), Request{Tool: tool.ID(tool.KindMCP, "cnt", name), ByID: true,
		Input: json.RawMessage(`{}`), IdempotencyKey: key})
	return err
}

// TestSharedRateLimit: two replicas on one PostgreSQL spend one budget.
func TestSharedRateLimit(t *testing.T) {
	t.Parallel()
	url := pgtest.Start(t)
	src := &countSource{}
	rl := RateLimit{PerMinute: 1, Burst: 3}
	a, b := replica(t, src, sharedStore(t, url), rl), replica(t, src, sharedStore(t, url), rl)
	for i, r := range []*Router{a, b, a} {
		if err := callTool(r, "plain", ""); err != nil {
			t.Fatalf("call %d of a budget of 3: %v", i, err)
		}
	}
	for _, r := range []*Router{b, a} {
		denied(t, callTool(r, "plain", ""), tool.CodeRateLimited, GateRateLimit)
	}
	if n := src.calls.Load(); n != 3 {
		t.Errorf("%d calls ran, want 3", n)
	}
}

// TestNoRoundTripWithoutSharedState: on a shared store, an ordinary call
// without a rate limit sends PostgreSQL nothing; a rate limit costs one
// statement a call.
func TestNoRoundTripWithoutSharedState(t *testing.T) {
	t.Parallel()
	url := pgtest.Start(t)
	src := &countSource{}
	st := sharedStore(t, url)
	r := replica(t, src, st, RateLimit{})
	before := st.Statements()
	for range 10 {
		if err := callTool(r, "plain", ""); err != nil {
			t.Fatal(err)
		}
		if err := callTool(r, "write", ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.Statements() - before; n != 0 {
		t.Errorf("20 ordinary calls sent %d statements, want 0", n)
	}
	// The count does see what does need the store: a key claims and completes.
	before = st.Statements()
	if err := callTool(r, "write", "k1"); err != nil {
		t.Fatal(err)
	}
	if n := st.Statements() - before; n != 2 {
		t.Errorf("an idempotent call sent %d statements, want 2 (claim, complete)", n)
	}

	limited := replica(t, src, st, RateLimit{PerMinute: 600, Burst: 100})
	before = st.Statements()
	for range 10 {
		if err := callTool(limited, "plain", ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.Statements() - before; n != 10 {
		t.Errorf("10 rate-limited calls sent %d statements, want 10 (one take each)", n)
	}
}

// TestStoreDownFailsClosed: with PostgreSQL stopped, a call that needs
// no shared state still runs; one that does is refused with
// capability_backend_unavailable, and does not run.
func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	url := srv.Database(t)
	src := &countSource{}
	st := sharedStore(t, url)
	r := replica(t, src, st, RateLimit{})
	limited := replica(t, src, st, RateLimit{PerMinute: 600, Burst: 100})
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := callTool(r, "write", ""); err != nil {
		t.Errorf("an ordinary call with the store down: %v", err)
	}
	ran := src.calls.Load()
	denied(t, callTool(r, "write", "k1"), tool.CodeBackendUnavailable, GateIdempotency)
	denied(t, callTool(limited, "plain", ""), tool.CodeBackendUnavailable, GateRateLimit)
	denied(t, callTool(r, "danger", ""), tool.CodeBackendUnavailable, GateApproval)
	denied(t, callTool(r, "linked", ""), tool.CodeBackendUnavailable, GateAuth)
	if n := src.calls.Load(); n != ran {
		t.Errorf("%d refused calls ran", n-ran)
	}
}
