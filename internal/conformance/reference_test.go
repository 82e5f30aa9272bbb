package conformance

import (
	"context"
	"sync"
	"testing"
)

// TestReferenceThroughCapgate runs the suite's frozen requirement sets
// (2025-11-25 and 2026-07-28) against the suite's reference server
// directly and through capgate in transparent mode (one upstream, prefix
// ""), each on a server of its own so the runs go side by side. A check
// that passes directly must pass through capgate, unless
// reference_gaps.json lists it with its reason.
func TestReferenceThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	t.Parallel() // the suite mostly waits (on its own timers and answers)
	InstallRef(t)
	gaps, err := LoadGaps("reference_gaps.json")
	if err != nil {
		t.Fatal(err)
	}
	// Each revision on servers of its own, so that the four runs go side
	// by side.
	for _, rev := range Revisions {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			direct, behind := StartReference(t), StartReference(t)
			cg := throughCapgate(t, "conformance", behind)
			var d, p map[string]Result
			var derr, perr error
			var wg sync.WaitGroup
			wg.Go(func() { d, derr = RunRequirements(context.Background(), t, direct, rev) })
			wg.Go(func() { p, perr = RunRequirements(context.Background(), t, cg.URL+"/mcp", rev) })
			wg.Wait()
			if derr != nil || perr != nil {
				t.Fatalf("%s: directly: %v; through capgate: %v", rev, derr, perr)
			}
			dp, dt := Passed(d)
			pp, pt := Passed(p)
			reg := Regressions(d, p)
			t.Logf("suite %s, requirements %s: directly %d of %d checks pass, through capgate %d of %d; %d pass directly and not through capgate",
				RefSuiteVersion, rev, dp, dt, pp, pt, len(reg))
			for _, err := range gaps.Check(rev, reg, p) {
				t.Error(err)
			}
		})
	}
}
