// Package testkit holds helpers shared by tests: building the fixture
// programs that tests run as real processes.
package testkit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/internal/testkit/pgtest"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
	workDir string
)

// Build compiles the main package pkg (an import path of this module, such
// as "github.com/capgate/capgate/internal/testkit/bridgefixture") once per
// test binary and returns the program's path.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	if workDir == "" {
		d, err := os.MkdirTemp("", "capgate-testkit-")
		if err != nil {
			tb.Fatal(err)
		}
		// Tools run as another user when capgate is root (run_as):
		// they must reach the programs built here.
		if err := os.Chmod(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		workDir = d
	}
	out := filepath.Join(workDir, filepath.Base(pkg))
	key := binKey(pkg)
	if cached, ok := linkedBefore(key); ok && os.Link(cached, out) == nil {
		now := time.Now()
		os.Chtimes(cached, now, now) // in use: see keepLinked
		built[pkg] = out
		return out
	}
	cmd := goCommand("build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, strings.TrimSpace(string(b)))
	}
	keepLinked(key, pkg, out)
	built[pkg] = out
	return out
}

// startEnv is the environment the test binary started with.
var startEnv = os.Environ()

// goCommand is the go command with args, in the environment the test
// binary started with: a test that moved HOME (t.Setenv) would otherwise
// send it to an empty build cache and module cache, and a fixture's build
// took a minute of CPU (and the network) instead of a link.
func goCommand(args ...string) *exec.Cmd {
	cmd := exec.Command("go", args...)
	cmd.Env = startEnv
	return cmd
}

// Linking capgate costs seconds of CPU, and every test binary that runs it
// used to link it again. A program is kept in binCache under the hash of
// the build ids of every package it is made of (go list -export compiles
// them, from the build cache when it can): any change to any of them is a
// new key, and an unchanged program is linked once per machine.
var binCache = filepath.Join(os.TempDir(), "capgate-testkit-bin")

// binKey is that hash, or "" when go list cannot say. The first call
// keys the programs Programs named too, in the same go list: each go list
// -export -deps costs about a second of CPU whatever it lists, as it
// loads and checks most of the module either way.
func binKey(pkg string) string {
	keysMu.Lock()
	defer keysMu.Unlock()
	if k, ok := keys[pkg]; ok {
		return k
	}
	batch := []string{pkg}
	for _, p := range programs {
		if _, done := keys[p]; !done && p != pkg {
			batch = append(batch, p)
		}
	}
	got := listKeys(batch)
	if _, ok := got[pkg]; !ok && len(batch) > 1 {
		got = listKeys(batch[:1]) // one of the others would not list
	}
	for p, k := range got {
		keys[p] = k
	}
	return got[pkg]
}

var (
	keysMu   sync.Mutex
	keys     = map[string]string{}
	programs []string
)

// Programs names the programs a package's tests Build, so that the first
// Build keys them all with one go list. Call it in TestMain.
func Programs(pkgs ...string) {
	keysMu.Lock()
	defer keysMu.Unlock()
	programs = append(programs, pkgs...)
}

// listKeys is binKey's hash for each of pkgs, from one go list; nil when
// go list fails.
func listKeys(pkgs []string) map[string]string {
	args := append([]string{"list", "-export", "-deps", "-f",
		"{{.ImportPath}} {{.BuildID}}{{if not .DepOnly}} {{join .Deps \" \"}}{{end}}"}, pkgs...)
	b, err := goCommand(args...).Output()
	if err != nil {
		return nil
	}
	ids := map[string]string{} // import path: build id
	deps := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case len(f) == 1: // a package with nothing to build: unsafe
			ids[f[0]] = ""
		default:
			ids[f[0]] = f[1]
			deps[f[0]] = f[2:]
		}
	}
	out := map[string]string{}
	for _, pkg := range pkgs {
		h := sha256.New()
		fmt.Fprintf(h, "%s/%s %s\n", runtime.GOOS, runtime.GOARCH, runtime.Version())
		for _, p := range append(slices.Sorted(slices.Values(deps[pkg])), pkg) {
			id, ok := ids[p]
			if !ok {
				return nil
			}
			fmt.Fprintf(h, "%s %s\n", p, id)
		}
		out[pkg] = filepath.Base(pkg) + "-" + hex.EncodeToString(h.Sum(nil)[:12])
	}
	return out
}

// linkedBefore is the cached program under key, if one was linked from
// the same packages.
func linkedBefore(key string) (string, bool) {
	if key == "" {
		return "", false
	}
	p := filepath.Join(binCache, key)
	_, err := os.Stat(p)
	return p, err == nil
}

// keepLinked stores a program just linked under its key (by a rename, so
// that a concurrent test binary sees it whole or not at all), and drops
// programs of the same name not used for an hour.
func keepLinked(key, pkg, out string) {
	if key == "" || os.MkdirAll(binCache, 0o755) != nil {
		return
	}
	old, _ := filepath.Glob(filepath.Join(binCache, filepath.Base(pkg)+"-*"))
	for _, o := range old {
		if fi, err := os.Stat(o); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.Remove(o)
		}
	}
	tmp, err := os.CreateTemp(binCache, ".tmp-")
	if err != nil {
		return
	}
	tmp.Close()
	os.Remove(tmp.Name())
	if os.Link(out, tmp.Name()) != nil || os.Rename(tmp.Name(), filepath.Join(binCache, key)) != nil {
		os.Remove(tmp.Name())
	}
}

// Cleanup removes what Build made; call it from TestMain after m.Run.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if workDir != "" {
		os.RemoveAll(workDir)
	}
	removeTempRoot()
}

// Main runs a package's tests and removes what Build made; use it as
// func TestMain(m *testing.M) { testkit.Main(m) }. The package's tests
// share one PostgreSQL (pgtest.Run: started on first use, a fresh
// database per test), rather than initdb a cluster each, and whatever
// else a helper shares through AtExit.
func Main(m *testing.M) {
	exitMu.Lock()
	inMain = true
	exitMu.Unlock()
	code := pgtest.Run(m)
	exitMu.Lock()
	funcs := exitFuncs
	exitFuncs = nil
	exitMu.Unlock()
	for i := len(funcs) - 1; i >= 0; i-- {
		funcs[i]()
	}
	Cleanup()
	os.Exit(code)
}

var (
	exitMu    sync.Mutex
	inMain    bool
	exitFuncs []func()
)

// AtExit has Main call f once the package's tests are done (the last
// registered first), for a helper that starts one server for all of a
// package's tests. It reports false, and keeps nothing, when the test
// binary does not run through Main: the caller then starts one per test.
func AtExit(f func()) bool {
	exitMu.Lock()
	defer exitMu.Unlock()
	if inMain {
		exitFuncs = append(exitFuncs, f)
	}
	return inMain
}

// WaitParallel sets -test.parallel to n unless the command line set it,
// for a package whose parallel tests mostly wait on the processes they
// start (capgate serve, PostgreSQL, haproxy, chromium): the default,
// GOMAXPROCS, is 2 on a 2-core machine, which ran them two at a time
// while both cores sat idle. Call it in TestMain before Main.
func WaitParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// MCPFixture is the upstream MCP server the tests run.
const MCPFixture = "github.com/capgate/capgate/internal/testkit/mcpfixture"

// TasksFixture is an upstream that offers the MCP tasks extension.
const TasksFixture = "github.com/capgate/capgate/internal/testkit/tasksfixture"

// HeadersFixture is an upstream whose tools carry x-mcp-header
// annotations (SEP-2243) and answer with the headers they were called with.
const HeadersFixture = "github.com/capgate/capgate/internal/testkit/headersfixture"

// HeadersClient is the client the conformance suite's SEP-2243 client
// scenarios run: it calls the scenario's server through a capgate serve.
const HeadersClient = "github.com/capgate/capgate/internal/testkit/headersclient"

// BridgeFixture is the bridge-v1 provider the tests run.
const BridgeFixture = "github.com/capgate/capgate/internal/testkit/bridgefixture"

// NoLandlock runs a program with the landlock syscalls refused (ENOSYS),
// for a capgate on a kernel that cannot prove filesystem guarantees.
const NoLandlock = "github.com/capgate/capgate/internal/testkit/nolandlock"

// ConformanceFixture is the import path of the upstream MCP server with the
// MCP conformance suite's tools, resources, templates and prompts.
const ConformanceFixture = "github.com/capgate/capgate/internal/testkit/conformancefixture"

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ServeMCPFixture runs the MCP fixture on addr with transport flag "-http"
// or "-sse" (after the flags in more, such as "-hostile"), waits until it
// listens, and returns a function that kills it (also called at cleanup).
func ServeMCPFixture(tb testing.TB, flag, addr string, more ...string) (kill func()) {
	tb.Helper()
	return ServeFixture(tb, MCPFixture, 10*time.Second, addr, append(more, flag, addr)...)
}

// ServeFixture builds the fixture program pkg, starts it with args and
// waits up to wait for it to listen on addr. Cleanup kills it; so does
// the returned function, at most once.
func ServeFixture(tb testing.TB, pkg string, wait time.Duration, addr string, args ...string) (kill func()) {
	tb.Helper()
	cmd := exec.Command(Build(tb, pkg), args...)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	kill = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	tb.Cleanup(kill)
	if !Poll(wait, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		kill()
		tb.Fatalf("%s did not listen on %s", path.Base(pkg), addr)
	}
	return kill
}

// Serve starts `bin serve --config config` with env added to the test's
// environment, waits for its start banner (up to startWait) and returns the
// process and the banner. Cleanup kills it unless the test stopped it.
func Serve(tb testing.TB, bin, config string, env ...string) (*exec.Cmd, string) {
	tb.Helper()
	cmd, banner, _ := ServeLogged(tb, bin, config, env...)
	return cmd, banner
}

// ServeLogged is Serve that also returns a function reading what the
// process has logged (its stderr) so far.
func ServeLogged(tb testing.TB, bin, config string, env ...string) (*exec.Cmd, string, func() string) {
	tb.Helper()
	return ServeArgs(tb, bin, []string{"serve", "--config", config}, env...)
}

// ServeArgs is ServeLogged with the command line given whole, for serve's
// other flags.
func ServeArgs(tb testing.TB, bin string, args []string, env ...string) (*exec.Cmd, string, func() string) {
	tb.Helper()
	return start(tb, bin, args, false, nil, env...)
}

// startWait is how long start waits for serve's banner. It is a deadline,
// not a measure: a serve that starts many upstreams (a test's 22) beside a
// package's other tests on a loaded machine took over 30 s.
const startWait = 2 * time.Minute

// start runs bin with args and env added, waits for serve's banner (up to
// startWait) and returns the process, the banner and a reader of its stderr.
// With group it runs in its own process group, which cleanup kills whole
// (the upstreams serve started too) and logs serve's output if tb failed.
// With cred it runs as that user.
func start(tb testing.TB, bin string, args []string, group bool, user *User, env ...string) (*exec.Cmd, string, func() string) {
	tb.Helper()
	cmd, banner, logs, err := launch(tb, bin, args, group, user, env...)
	if err != nil {
		tb.Fatal(err)
	}
	return cmd, banner, logs
}

// launch is start that returns the error of a serve that exited or did not
// start in time (with what it logged) instead of failing tb, for a caller
// that may try again.
func launch(tb testing.TB, bin string, args []string, group bool, user *User, env ...string) (*exec.Cmd, string, func() string, error) {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	if user != nil {
		runAs(cmd, user)
	}
	cmd.Env = append(os.Environ(), env...)
	if group {
		proc.NewGroup(cmd)
	}
	var stderr, out strings.Builder
	var mu sync.Mutex
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return stderr.Write(b)
	})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	errText := func() string { mu.Lock(); defer mu.Unlock(); return stderr.String() }
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			if group {
				proc.KillGroup(cmd.Process)
			} else {
				cmd.Process.Kill()
			}
			cmd.Wait()
		} else if group {
			proc.KillGroup(cmd.Process) // what serve left behind
		}
		if group && tb.Failed() {
			mu.Lock()
			defer mu.Unlock()
			tb.Logf("capgate serve stdout:\n%s\nstderr:\n%s", out.String(), stderr.String())
		}
	})
	ready := make(chan string, 1)
	go func() {
		defer close(ready) // the process ended before its banner
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			banner := out.String()
			mu.Unlock()
			if strings.Contains(sc.Text(), "a dev token") {
				ready <- banner
			}
		}
	}()
	select {
	case banner, ok := <-ready:
		if !ok {
			cmd.Wait()
			return nil, "", nil, fmt.Errorf("capgate serve exited:\n%s", errText())
		}
		return cmd, banner, errText, nil
	case <-time.After(startWait):
		return nil, "", nil, fmt.Errorf("capgate serve did not start within %v:\n%s", startWait, errText())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// PostMCP posts one stateless (2026-07-28) tools/call body to base+"/mcp"
// with the token and returns the status, the content type and the body.
func PostMCP(tb testing.TB, base, tok, name, body string) (int, string, []byte) {
	tb.Helper()
	return PostMCPMethod(tb, base, tok, "tools/call", name, body)
}

// PostMCPMethod is PostMCP for any method: Mcp-Method is method, and
// Mcp-Name name (the tool, prompt or resource the request names).
func PostMCPMethod(tb testing.TB, base, tok, method, name, body string) (int, string, []byte) {
	tb.Helper()
	return PostMCPWith(tb, base, tok, method, name, body, nil)
}

// PostMCPWith is PostMCPMethod with more headers (Mcp-Param-*, say), set
// after the standard ones.
func PostMCPWith(tb testing.TB, base, tok, method, name, body string, more map[string]string) (int, string, []byte) {
	tb.Helper()
	headers := map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Name": name}
	maps.Copy(headers, more)
	return post(tb, base, tok, body, headers)
}

// post posts body to base+"/mcp" as an MCP client with the token and the
// headers, and reads the answer: status, content type, body.
func post(tb testing.TB, base, tok, body string, headers map[string]string) (int, string, []byte) {
	tb.Helper()
	resp := postMCP(tb, base, tok, body, headers)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

func postMCP(tb testing.TB, base, tok, body string, headers map[string]string) *http.Response {
	tb.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	return resp
}

// ToolUID is the uid a root capgate's tools run as by default ([sandbox]
// run_as unset: nobody).
const ToolUID = 65534

// ToolDir is a temp dir the tools of a capgate this test starts may write
// into: under root they run as nobody, so it is theirs; otherwise they run
// as this user, whose it is already.
func ToolDir(tb testing.TB) string {
	tb.Helper()
	d := tb.TempDir()
	// The testing package makes the test's own temp dir 0700.
	if err := os.Chmod(filepath.Dir(d), 0o755); err != nil {
		tb.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(d, ToolUID, ToolUID); err != nil {
			tb.Fatal(err)
		}
	}
	return d
}

// BuildStamped builds pkg as a user would to see its version (go build
// -buildvcs=true, run in the current directory's checkout) into dir and
// returns the program's path. stamp must name everything go build stamps
// from the checkout besides the packages (the commit, its tags, whether
// the tree is modified): with it, a program is linked once per machine
// per stamp and packages, as Build's are.
func BuildStamped(tb testing.TB, pkg, stamp, dir string) string {
	tb.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	key := binKey(pkg)
	if key != "" {
		h := sha256.Sum256([]byte(key + "\x00" + stamp))
		key = filepath.Base(pkg) + "-vcs-" + hex.EncodeToString(h[:12])
	}
	if cached, ok := linkedBefore(key); ok && os.Link(cached, out) == nil {
		now := time.Now()
		os.Chtimes(cached, now, now)
		return out
	}
	// -buildvcs=true on the command line beats a GOFLAGS=-buildvcs=false.
	if b, err := goCommand("build", "-buildvcs=true", "-o", out, pkg).CombinedOutput(); err != nil {
		tb.Fatalf("go build -buildvcs=true %s: %v\n%s", pkg, err, strings.TrimSpace(string(b)))
	}
	keepLinked(key, filepath.Base(pkg)+"-vcs", out)
	return out
}
