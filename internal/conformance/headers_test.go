package conformance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// headerScenarios are the suite's server scenarios of SEP-2243: the
// standard headers (Mcp-Method, Mcp-Name) and the custom ones
// (Mcp-Param-*, from x-mcp-header annotations).
var headerScenarios = []string{"http-header-validation", "http-custom-header-server-validation"}

// TestHeadersThroughCapgate runs the suite's SEP-2243 server scenarios
// against an upstream whose tools carry x-mcp-header annotations
// (internal/testkit/headersfixture), directly and through capgate
// (transparent: one upstream, prefix ""). The fixture passes them all
// directly, and every check must pass through capgate too: capgate checks
// the caller's headers itself and mirrors the arguments to the upstream,
// which checks them again (before capgate mirrored them, the upstream
// refused each call the suite expects to succeed).
func TestHeadersThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	t.Parallel()
	InstallRef(t)
	var urls [2]string
	for i := range urls {
		addr := testkit.FreeAddr(t)
		testkit.ServeFixture(t, testkit.HeadersFixture, 15*time.Second, addr, "-http", addr)
		urls[i] = "http://" + addr + "/mcp"
	}
	cg := testkit.StartCapgate(t, testkit.Capgate{Secret: "conformance-secret", Config: fmt.Sprintf(`
[auth.anonymous]
sub = "conformance"
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.hf]
url = %q
prefix = ""
`, urls[1])})
	d, p := map[string]Result{}, map[string]Result{}
	for _, sc := range headerScenarios {
		var dr, pr map[string]Result
		var derr, perr error
		var wg sync.WaitGroup
		wg.Go(func() { dr, derr = RunScenario(context.Background(), t, urls[0], "2026-07-28", sc) })
		wg.Go(func() { pr, perr = RunScenario(context.Background(), t, cg.URL+"/mcp", "2026-07-28", sc) })
		wg.Wait()
		if derr != nil || perr != nil {
			t.Fatalf("%s directly: %v; through capgate: %v", sc, derr, perr)
		}
		maps.Copy(d, dr)
		maps.Copy(p, pr)
	}
	dp, dt := Passed(d)
	pp, pt := Passed(p)
	t.Logf("suite %s, SEP-2243 server scenarios: directly %d of %d checks pass, through capgate %d of %d", RefSuiteVersion, dp, dt, pp, pt)
	for _, sc := range headerScenarios {
		if len(d[sc].Checks) < 10 {
			t.Errorf("%s ran %d checks directly, want at least 10: %+v", sc, len(d[sc].Checks), d[sc])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d)) {
		for _, problem := range d[name].Problems() {
			t.Errorf("directly, %s: %s", name, problem)
		}
		for _, problem := range p[name].Problems() {
			t.Errorf("through capgate, %s: %s", name, problem)
		}
	}
	reg := Regressions(d, p)
	for _, k := range slices.Sorted(maps.Keys(reg)) {
		t.Errorf("%s passes directly and fails through capgate: %s", k, reg[k])
	}
}
