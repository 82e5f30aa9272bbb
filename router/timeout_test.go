package router

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// deadlineSource reports the deadline its Call was given; bound, when
// set, is its tool.Bounded timeout.
type deadlineSource struct {
	id    string
	bound time.Duration
	got   chan time.Time // zero: no deadline
}

func (s *deadlineSource) ID() string      { return s.id }
func (s *deadlineSource) Kind() tool.Kind { return tool.KindMCP }
func (s *deadlineSource) List(context.Context) ([]*tool.Descriptor, error) {
	return []*tool.Descriptor{{
		ID: tool.ID(tool.KindMCP, s.id, "t"), Kind: tool.KindMCP, Source: s.id, Name: "t", Available: true,
		InputSchema: json.RawMessage(`{"type":"object"}`), Risk: risk.Assessment{Level: risk.Low},
	}}, nil
}
func (s *deadlineSource) Call(ctx context.Context, _ tool.Call) (*tool.Result, error) {
	dl, _ := ctx.Deadline()
	s.got <- dl
	return tool.TextResult("ok"), nil
}

type boundedSource struct{ *deadlineSource }

func (s boundedSource) CallTimeout() time.Duration { return s.bound }

// TestCallTimeoutLeftToBoundedSource: the router times a call itself
// unless the source bounds it (tool.Bounded) within the router's timeout.
// A source that bounds it later, or not at all, gets the router's deadline.
func TestCallTimeoutLeftToBoundedSource(t *testing.T) {
	ctx := context.Background()
	const timeout = time.Minute
	short := &deadlineSource{id: "short", bound: time.Second, got: make(chan time.Time, 1)}
	same := &deadlineSource{id: "same", bound: timeout, got: make(chan time.Time, 1)}
	long := &deadlineSource{id: "long", bound: time.Hour, got: make(chan time.Time, 1)}
	plain := &deadlineSource{id: "plain", got: make(chan time.Time, 1)}
	reg, err := registry.New(ctx, []tool.Source{boundedSource{short}, boundedSource{same}, boundedSource{long}, plain}, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	dir := t.TempDir()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log, err := audit.Open(filepath.Join(dir, "audit.jsonl"), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	table, _ := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	r, err := New(Options{Registry: reg, Risk: table, State: st, Audit: log, CallTimeout: timeout,
		Policy: Policy{Anonymous: &Subject{Sub: "anon", Grants: []string{"rye.fetch.*", "rye.execute.*"}, Acknowledge: []string{"elevated"}}}})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Anonymous()
	for _, tc := range []struct {
		src         *deadlineSource
		routerTimes bool
	}{{short, false}, {same, false}, {long, true}, {plain, true}} {
		before := time.Now()
		if _, err := r.Call(ctx, c, Request{Tool: tc.src.id + "__t", Input: json.RawMessage(`{}`), Protocol: "test"}); err != nil {
			t.Fatalf("%s: %v", tc.src.id, err)
		}
		dl := <-tc.src.got
		switch {
		case tc.routerTimes && (dl.Before(before.Add(timeout)) || dl.After(time.Now().Add(timeout))):
			t.Errorf("%s: deadline %v, want the router's, %v from the call", tc.src.id, dl, timeout)
		case !tc.routerTimes && !dl.IsZero():
			t.Errorf("%s: deadline %v, want none of the router's: the source bounds the call itself", tc.src.id, dl)
		}
	}
}
