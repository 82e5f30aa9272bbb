package router

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/capgate/capgate/tool"
)

// spans records the spans the chain makes, in order, with how each ended.
type spans struct {
	mu  sync.Mutex
	got []string // "gate <name>=<error type>"
}

type span struct {
	s    *spans
	name string
}

func (s *spans) Gate(_ context.Context, gate string) Span { return span{s, "gate " + gate} }
func (s *spans) Upstream(ctx context.Context, name, _, _, _ string) (context.Context, Span) {
	return ctx, span{s, "tools/call " + name}
}
func (sp span) End(errorType string) {
	sp.s.mu.Lock()
	defer sp.s.mu.Unlock()
	sp.s.got = append(sp.s.got, sp.name+"="+errorType)
}

func (s *spans) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.got
	s.got = nil
	return out
}

// tracedEnv is newEnv whose router records its spans.
func tracedEnv(t *testing.T, p Policy) (*env, *spans) {
	t.Helper()
	e := newEnv(t, p)
	rec := &spans{}
	o := e.r.opts
	o.Tracer = rec
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.r = r
	return e, rec
}

// The chain's order is the one docs/design.md gives; every gate but the
// two that use something (idempotency, approval) runs when planning.
func TestChainOrder(t *testing.T) {
	var names, planned []string
	for _, g := range newChain() {
		names = append(names, g.name)
		if g.plan != nil {
			planned = append(planned, g.name)
		}
	}
	want := []string{"resolve", "input", "capability", "acknowledge", "side_effects", "chat_policy", "auth", "schema", "audit",
		"rate_limit", "idempotency", "approval"}
	if !slices.Equal(names, want) {
		t.Errorf("chain %q, want %q", names, want)
	}
	if !slices.Equal(planned, want[:10]) {
		t.Errorf("planning runs %q, want %q", planned, want[:10])
	}
}

// Each gate a call passes gets one span from the chain, in order, then the
// upstream call; a refusal ends the chain at its gate, with its code.
func TestChainSpansEachGateOnce(t *testing.T) {
	e, rec := tracedEnv(t, everyone)
	alice := e.caller(t, "alice", "private")
	if _, err := e.call(alice, "fx__echo", `{"message":"hi"}`); err != nil {
		t.Fatal(err)
	}
	want := []string{"gate resolve=", "gate input=", "gate capability=", "gate acknowledge=", "gate side_effects=", "gate chat_policy=",
		"gate auth=", "gate schema=", "gate audit=", "gate rate_limit=", "gate idempotency=", "gate approval=",
		"tools/call echo="}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Errorf("spans of an allowed call:\n%q\nwant\n%q", got, want)
	}

	// The schema refuses: the chain stops there, nothing is taken.
	_, err := e.call(alice, "fx__echo", `{"message":3}`)
	denied(t, err, tool.CodeInvalidInput, GateInput)
	if got := rec.take(); !slices.Equal(got, append(want[:7:7], "gate schema="+string(tool.CodeInvalidInput))) {
		t.Errorf("spans of a call the schema refuses: %q", got)
	}
}

// A planning call passes the same gates without side effects: the rate
// limit only looks (its token stays for the real call), no key is
// claimed, no approval requested.
func TestPlanningIsTheChainWithoutSideEffects(t *testing.T) {
	p := everyone
	p.RateLimit = RateLimit{PerMinute: 1, Burst: 1}
	e, rec := tracedEnv(t, p)
	alice := e.caller(t, "alice", "private")
	req := Request{Tool: "fx__t_00", Input: json.RawMessage(`{}`), IdempotencyKey: "k1"}
	for range 3 {
		plan, err := e.r.Plan(context.Background(), alice, req)
		if err != nil || !plan.Allowed || plan.RateLimit != "ok" {
			t.Fatalf("plan: %+v %+v %v", plan, plan.Denial, err)
		}
	}
	got := rec.take()
	if len(got) != 30 || slices.ContainsFunc(got, func(s string) bool {
		return strings.HasPrefix(s, "gate idempotency") || strings.HasPrefix(s, "gate approval") || strings.HasPrefix(s, "tools/call")
	}) {
		t.Errorf("spans of three planning calls: %q", got)
	}
	// The one token of the bucket is still there: the real call gets it.
	if _, err := e.r.Call(context.Background(), alice, req); err != nil {
		t.Fatalf("the call after planning: %v", err)
	}
	plan, err := e.r.Plan(context.Background(), alice, req)
	if err != nil || plan.Allowed || plan.RateLimit != "limited" {
		t.Errorf("plan once the bucket is empty: %+v %v", plan, err)
	}
}
