package conformance

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// startTasksFixture serves internal/testkit/tasksfixture (an upstream that
// offers the tasks extension with the suite's fixture tools) and returns
// its MCP URL.
func startTasksFixture(t *testing.T) string {
	t.Helper()
	addr := testkit.FreeAddr(t)
	testkit.ServeFixture(t, testkit.TasksFixture, 15*time.Second, addr, "-http", addr)
	return "http://" + addr + "/mcp"
}

// tasksOnly is the tasks extension's scenarios of results.
func tasksOnly(results map[string]Result) map[string]Result {
	maps.DeleteFunc(results, func(name string, _ Result) bool { return !strings.HasPrefix(name, "tasks-") })
	return results
}

// TestTasksThroughCapgate runs the suite's tasks scenarios against an
// upstream that offers the extension, directly and through capgate
// (transparent: one upstream, prefix ""). Every check that passes directly
// must pass through capgate, and the fixture must pass them all directly
// (else the comparison proves little); the one check the suite
// skips (status notifications, optional) is neither.
func TestTasksThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	t.Parallel()
	InstallRef(t)
	direct, behind := startTasksFixture(t), startTasksFixture(t)
	cg := throughCapgate(t, "conformance", behind)
	var d, p map[string]Result
	var derr, perr error
	var wg sync.WaitGroup
	// The whole 2026-07-28 set (one run is faster than one per scenario);
	// the fixture serves only the tasks scenarios' tools, so only those count.
	wg.Go(func() { d, derr = RunRequirements(context.Background(), t, direct, "2026-07-28") })
	wg.Go(func() { p, perr = RunRequirements(context.Background(), t, cg.URL+"/mcp", "2026-07-28") })
	wg.Wait()
	if derr != nil || perr != nil {
		t.Fatalf("directly: %v; through capgate: %v", derr, perr)
	}
	d, p = tasksOnly(d), tasksOnly(p)
	dp, dt := Passed(d)
	pp, pt := Passed(p)
	t.Logf("suite %s, tasks scenarios: directly %d of %d checks pass, through capgate %d of %d", RefSuiteVersion, dp, dt, pp, pt)
	if len(d) < 10 {
		t.Errorf("the suite ran %d tasks scenarios, want the 2026-07-28 set's 10: %v", len(d), slices.Sorted(maps.Keys(d)))
	}
	for _, name := range slices.Sorted(maps.Keys(d)) {
		for _, problem := range d[name].Problems() {
			t.Errorf("directly, %s: %s", name, problem)
		}
	}
	reg := Regressions(d, p)
	for _, k := range slices.Sorted(maps.Keys(reg)) {
		t.Errorf("%s passes directly and fails through capgate: %s", k, reg[k])
	}
}
