package conformance

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// The suite at its frozen requirement sets (--requirements REVISION), run
// against the suite's own reference server ("everything", TypeScript),
// whose source is vendored under testdata/everything (see PINNED there).

// RefSuiteVersion is the suite version of the requirement sets, as pinned
// in testdata/suite-0.2/package-lock.json.
const RefSuiteVersion = "0.2.0-alpha.12"

// Revisions are the requirement sets run.
var Revisions = []string{"2025-11-25", "2026-07-28"}

var (
	//go:embed testdata/suite-0.2/package.json
	refPackageJSON []byte
	//go:embed testdata/suite-0.2/package-lock.json
	refPackageLock []byte
	//go:embed testdata/everything/everything-server.ts
	everythingTS []byte
	//go:embed testdata/everything/package.json
	everythingJSON []byte
	//go:embed testdata/everything/package-lock.json
	everythingLock []byte
)

var refNode, refSuite, everythingDir, everythingJS string

// InstallRef installs the suite at RefSuiteVersion, its Node 22, and the
// reference server's packages (npm ci each, once, in CacheDir) and returns
// the node binary and the suite's entry script.
func InstallRef(tb testing.TB) (nodeBin, suiteBin string) {
	tb.Helper()
	installMu.Lock()
	defer installMu.Unlock()
	if refNode != "" {
		return refNode, refSuite
	}
	dir := installPackage(tb, "suite-"+RefSuiteVersion, map[string][]byte{"package.json": refPackageJSON, "package-lock.json": refPackageLock})
	nodeBin, err := findNode(dir)
	if err != nil {
		unavailable(tb, "%v", err)
	}
	// The TypeScript bundled once, as tsx would compile it at every start
	// (esbuild, the Node version's target, names kept), with the packages
	// it imports: node --import tsx cost about 2 s of CPU per start, and
	// the package starts the reference server seven times.
	everythingJS = bundleOnce(tb, nodeBin, installEverything(tb, nodeBin), "everything-server.ts")
	refNode, refSuite = nodeBin, suiteEntry(tb, nodeBin, dir)
	return refNode, refSuite
}

// installEverything installs the reference server's packages (npm ci,
// once) and returns their directory. Callers hold installMu.
func installEverything(tb testing.TB, nodeBin string) string {
	tb.Helper()
	if everythingDir == "" {
		// The server's npm ci may run install scripts with node: the suite's.
		os.Setenv("PATH", filepath.Dir(nodeBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
		everythingDir = installPackage(tb, "everything", map[string][]byte{
			"everything-server.ts": everythingTS, "package.json": everythingJSON, "package-lock.json": everythingLock})
	}
	return everythingDir
}

// StartReference serves the reference server on a free loopback port and
// returns its MCP URL; it is killed at cleanup.
func StartReference(tb testing.TB) string {
	tb.Helper()
	nodeBin, _ := InstallRef(tb)
	addr := testkit.FreeAddr(tb)
	_, port, _ := net.SplitHostPort(addr)
	out := &lockedWriter{}
	cmd := exec.Command(nodeBin, everythingJS)
	cmd.Dir = everythingDir
	cmd.Env = nodeEnv("PORT=" + port)
	cmd.Stdout, cmd.Stderr = out, out
	serveUntilCleanup(tb, cmd, addr, "the reference server", 60*time.Second, out)
	return "http://localhost:" + port + "/mcp"
}

// RunRequirements runs the scenarios that revision requires (frozen at its
// release) against url.
func RunRequirements(ctx context.Context, tb testing.TB, url, revision string) (map[string]Result, error) {
	tb.Helper()
	nodeBin, suiteBin := InstallRef(tb)
	return runSuite(ctx, tb, nodeBin, suiteBin, url, "--requirements", revision)
}

// RunScenario runs one scenario at revision's wire against url.
func RunScenario(ctx context.Context, tb testing.TB, url, revision, scenario string) (map[string]Result, error) {
	tb.Helper()
	nodeBin, suiteBin := InstallRef(tb)
	return runSuite(ctx, tb, nodeBin, suiteBin, url, "--scenario", scenario, "--spec-version", revision)
}

// Passed counts the checks with status SUCCESS.
func Passed(results map[string]Result) (passed, total int) {
	for _, r := range results {
		for _, c := range r.Checks {
			total++
			if c.Status == "SUCCESS" {
				passed++
			}
		}
	}
	return passed, total
}

// Regressions lists, as "scenario/check", every check that passed
// directly and did not through the proxy (failed, warned, or did not
// run), each with what the proxied run said.
func Regressions(direct, proxied map[string]Result) map[string]string {
	out := map[string]string{}
	for name, d := range direct {
		p := proxied[name]
		got := map[string]Check{}
		for _, c := range p.Checks {
			got[c.ID] = c
		}
		for _, c := range d.Checks {
			if c.Status != "SUCCESS" {
				continue
			}
			pc, ok := got[c.ID]
			switch {
			case !ok:
				out[name+"/"+c.ID] = "did not run through the proxy"
			case pc.Status != "SUCCESS" && pc.Status != "INFO":
				out[name+"/"+c.ID] = pc.Status + ": " + pc.ErrorMessage
			}
		}
	}
	return out
}

// Gap is a check known to pass directly and fail through capgate.
type Gap struct {
	// Reason says why, naming the issue item that will close it.
	Reason string `json:"reason"`
	// Flaky: it fails only sometimes (a race outside the check), so its
	// passing is not news.
	Flaky bool `json:"flaky,omitempty"`
}

// Gaps are the known gaps by revision, then "scenario/check".
type Gaps struct {
	Suite string                    `json:"suite"`
	Gaps  map[string]map[string]Gap `json:"gaps"`
}

// LoadGaps reads and validates a gaps file.
func LoadGaps(path string) (*Gaps, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var g Gaps
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if g.Suite != RefSuiteVersion {
		return nil, fmt.Errorf("%s: key suite: %q, want %q (the pinned suite)", path, g.Suite, RefSuiteVersion)
	}
	for rev, m := range g.Gaps {
		if !slices.Contains(Revisions, rev) {
			return nil, fmt.Errorf("%s: key gaps.%s: not a revision run (%v)", path, rev, Revisions)
		}
		for k, gap := range m {
			if strings.TrimSpace(gap.Reason) == "" {
				return nil, fmt.Errorf("%s: key gaps.%s.%q.reason: a gap needs a reason", path, rev, k)
			}
		}
	}
	return &g, nil
}

// Check compares one revision's regressions with the known gaps: an
// unlisted regression is a problem, and so is a listed gap, not flaky,
// whose check passes through capgate now (the file is stale).
func (g *Gaps) Check(revision string, regressions map[string]string, proxied map[string]Result) []error {
	var errs []error
	known := g.Gaps[revision]
	for _, k := range slices.Sorted(maps.Keys(regressions)) {
		if _, ok := known[k]; !ok {
			errs = append(errs, fmt.Errorf("%s %s passes directly and fails through capgate: %s", revision, k, regressions[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(known)) {
		if _, still := regressions[k]; still || known[k].Flaky || status(proxied, k) != "SUCCESS" {
			continue
		}
		errs = append(errs, fmt.Errorf("%s %s: listed as a gap (%s) but passes through capgate now; remove it", revision, k, known[k].Reason))
	}
	return errs
}

// status is the status of check "scenario/check" in results, or "".
func status(results map[string]Result, key string) string {
	scenario, id, _ := strings.Cut(key, "/")
	for _, c := range results[scenario].Checks {
		if c.ID == id {
			return c.Status
		}
	}
	return ""
}
