package conformance

import (
	"context"
	"strings"
	"sync"
	"testing"
)

// TestConformanceThroughCapgate (expected results in capgate_baseline.json,
// today every scenario passing) runs the suite against the fixture
// directly and through capgate in transparent mode (one upstream, prefix
// ""), with anonymous callers as the suite sends no token. Scenarios that
// differ must be listed, with their reason, in capgate_baseline.json.
func TestConformanceThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	t.Parallel() // the suite mostly waits (on its own timers and answers)
	Install(t)
	// capgate's upstream is a fixture of its own, so that this run and
	// the direct one (directFixtureRun) go side by side.
	behind := StartFixture(t)
	cg := throughCapgate(t, "conformance", behind)
	var proxied map[string]Result
	var perr error
	var wg sync.WaitGroup
	wg.Go(func() { proxied, perr = Run(context.Background(), t, cg.URL+"/mcp") })
	direct, derr := directFixtureRun(t)
	wg.Wait()
	if derr != nil || perr != nil {
		t.Fatalf("directly: %v; through capgate: %v", derr, perr)
	}
	t.Logf("direct:  %s", Summary(direct))
	t.Logf("capgate: %s", Summary(proxied))
	base, err := LoadBaseline("capgate_baseline.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range base.Check(proxied) {
		t.Error(p)
	}
	// Every difference from the direct run is a listed, explained failure.
	for _, d := range Compare(direct, proxied) {
		name, _, _ := strings.Cut(d, ":")
		if e, ok := base.Scenarios[name]; !ok || e.Expect == "pass" {
			t.Errorf("through capgate differs from direct, unexplained: %s", d)
		}
	}
}
