package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
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
	cg := throughCapgate(t, "conformance", urls[1])
	// Every run at once: each scenario's calls stand alone.
	runs := make([][2]map[string]Result, len(headerScenarios))
	errs := make([][2]error, len(headerScenarios))
	var wg sync.WaitGroup
	for i, sc := range headerScenarios {
		for j, url := range []string{urls[0], cg.URL + "/mcp"} {
			wg.Go(func() { runs[i][j], errs[i][j] = RunScenario(context.Background(), t, url, "2026-07-28", sc) })
		}
	}
	wg.Wait()
	d, p := map[string]Result{}, map[string]Result{}
	for i, sc := range headerScenarios {
		if errs[i][0] != nil || errs[i][1] != nil {
			t.Fatalf("%s directly: %v; through capgate: %v", sc, errs[i][0], errs[i][1])
		}
		maps.Copy(d, runs[i][0])
		maps.Copy(p, runs[i][1])
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

// TestHeadersClientThroughCapgate runs the suite's SEP-2243 client
// scenarios with capgate as the client: the suite's scenario server is
// capgate's one upstream, and internal/testkit/headersclient calls it
// through capgate (tools/list, then the scenario's calls). What the suite
// checks is what capgate sends: every annotated argument mirrored into its
// Mcp-Param-* header, encoded as the specification says, none for
// unannotated or absent ones (http-custom-headers); the tools with
// invalid annotations never called, the valid one called
// (http-invalid-tool-headers); Mcp-Method and Mcp-Name on each request
// (http-standard-headers). No check may fail or warn.
func TestHeadersClientThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	t.Parallel()
	nodeBin, suiteBin := InstallRef(t)
	command := fmt.Sprintf("%s -capgate %s -dir %s", testkit.Build(t, testkit.HeadersClient), testkit.Build(t, testkit.CapgatePkg), t.TempDir())
	for scenario, least := range map[string]int{"http-custom-headers": 18, "http-invalid-tool-headers": 12, "http-standard-headers": 6} {
		t.Run(scenario, func(t *testing.T) {
			t.Parallel()
			clientScenario(t, nodeBin, suiteBin, command, scenario, least)
		})
	}
}

// clientScenario runs one client scenario and requires at least least
// checks to pass, and none to fail or warn.
func clientScenario(t *testing.T, nodeBin, suiteBin, command, scenario string, least int) {
	{
		checks, text := runClient(t, nodeBin, suiteBin, command, scenario)
		passed := 0
		for _, c := range checks {
			switch c.Status {
			case "SUCCESS":
				passed++
			case "FAILURE", "WARNING":
				t.Errorf("%s: %s %s (%s): %s", scenario, c.Status, c.Name, c.ID, c.ErrorMessage)
			}
		}
		t.Logf("suite %s, %s through capgate: %d of %d checks pass", RefSuiteVersion, scenario, passed, len(checks))
		if passed < least {
			t.Errorf("%s: %d checks passed, want at least %d", scenario, passed, least)
		}
		if t.Failed() {
			t.Logf("the suite's output, the client's stderr in it:\n%s", text)
		}
	}
}

// runClient runs the suite's client scenario at 2026-07-28 with command
// as the client and returns its checks.
func runClient(t *testing.T, nodeBin, suiteBin, command, scenario string) ([]Check, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := t.TempDir()
	cmd := exec.CommandContext(ctx, nodeBin, suiteBin, "client", "--command", command, "--scenario", scenario,
		"--spec-version", "2026-07-28", "--timeout", "60000", "-o", out)
	cmd.Env = nodeEnv("NO_COLOR=1", "FORCE_COLOR=0")
	text, _ := cmd.CombinedOutput()
	dirs, _ := filepath.Glob(filepath.Join(out, scenario+"-*", "checks.json"))
	if len(dirs) != 1 {
		t.Fatalf("%s: the suite wrote %d checks.json:\n%s", scenario, len(dirs), text)
	}
	b, err := os.ReadFile(dirs[0])
	var checks []Check
	if err == nil {
		err = json.Unmarshal(b, &checks)
	}
	if err != nil || len(checks) == 0 {
		t.Fatalf("%s: %v %s\n%s", scenario, err, b, text)
	}
	return checks, text
}
