package mcp

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/tool"
)

// TestProgressMerge: a call's progress from two streams goes on forward;
// one that the other stream overtook is dropped; each stream alone passes
// as it came, going back included.
func TestProgressMerge(t *testing.T) {
	type note struct {
		standalone bool
		p          float64
	}
	c := func(p float64) note { return note{false, p} }
	g := func(p float64) note { return note{true, p} }
	for _, tc := range []struct {
		name    string
		in      []note
		want    []float64
		dropped int
	}{
		{"one stream", []note{c(0), c(50), c(100)}, []float64{0, 50, 100}, 0},
		{"split in order", []note{c(0), g(50), c(100)}, []float64{0, 50, 100}, 0},
		{"overtaken on the standalone stream", []note{c(0), c(100), g(50)}, []float64{0, 100}, 1},
		{"overtaken on the call's", []note{g(19), g(20), c(1), c(2), c(21)}, []float64{19, 20, 21}, 2},
		{"equal is not back", []note{c(5), g(5)}, []float64{5, 5}, 0},
		{"one stream going back passes", []note{c(3), c(1), c(2)}, []float64{3, 1, 2}, 0},
		{"only the standalone stream", []note{g(1), g(2), g(3)}, []float64{1, 2, 3}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []float64
			m := newProgressMerge(func(p, _ float64, _ string) { got = append(got, p) })
			for _, n := range tc.in {
				if n.standalone {
					m.fromStandalone(n.p, 100, "")
				} else {
					m.fromCall(n.p, 100, "")
				}
			}
			if !slices.Equal(got, tc.want) || m.dropped() != tc.dropped {
				t.Errorf("relayed %v, dropped %d; want %v, %d", got, m.dropped(), tc.want, tc.dropped)
			}
		})
	}
}

// TestProgressSplitGoesForward calls the fixture's progress_burst, which
// sends 20 progress notifications back to back, on a 2025-11-25 session
// with its standalone stream open: mcp-go v1.2.1 splits them between that
// stream and the call's (progress.go), and without the merge a caller saw
// them out of order in most calls. Every call's progress goes forward, up to
// the last, and the merge never relays what the upstream did not send.
func TestProgressSplitGoesForward(t *testing.T) {
	s := connect(t, Options{Name: "fx", URL: conformance.StartFixture(t), Protocol: Protocol, Timeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ds, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	burst := find(t, ds, "progress_burst")
	relayed := 0
	for i := range 10 {
		var mu sync.Mutex
		var got []float64
		res, err := s.Call(ctx, tool.Call{Tool: burst, Input: json.RawMessage(`{"count":20}`),
			Progress: func(p, total float64, _ string) {
				mu.Lock()
				got = append(got, p)
				mu.Unlock()
				if total != 20 {
					t.Errorf("total %v, want 20", total)
				}
			}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %+v", i+1, err, res)
		}
		mu.Lock()
		if len(got) == 0 || !slices.IsSorted(got) || got[0] < 1 || got[len(got)-1] > 20 {
			t.Errorf("call %d: progress %v, want it going forward from 1 to at most 20", i+1, got)
		}
		relayed += len(got)
		mu.Unlock()
	}
	t.Logf("%d of 200 notifications relayed", relayed)
}
