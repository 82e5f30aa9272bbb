//go:build linux

package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// The test binary is the trampoline, as capgate is in production.
func TestMain(m *testing.M) {
	Main()
	if js, ok := os.LookupEnv(launchAsEnv); ok {
		os.Exit(launchFromEnv(js))
	}
	testkit.Main(m)
}

const hostilePkg = "github.com/capgate/capgate/internal/testkit/hostile"

// world is what a hostile tool reaches for: a work dir, a file outside it,
// capgate's data dir with a key in it, an operator-listed read dir, a TCP
// and a UDP listener on 127.0.0.1.
type world struct {
	tool, work, outside, data, key, readDir, readFile string
	tcp, udp                                          string
}

func newWorld(t *testing.T) world {
	t.Helper()
	root := t.TempDir()
	w := world{tool: testkit.Build(t, hostilePkg), work: filepath.Join(root, "work"),
		outside: filepath.Join(root, "outside.txt"), data: filepath.Join(root, "data"), readDir: filepath.Join(root, "shared")}
	w.key = filepath.Join(w.data, "token.key")
	w.readFile = filepath.Join(w.readDir, "notes.txt")
	for _, d := range []string{w.work, w.data, w.readDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{w.outside: "outside", w.key: "secret-key-bytes", w.readFile: "shared-notes"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	w.tcp = ln.Addr().String()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	w.udp = pc.LocalAddr().String()
	return w
}

// attempts are every attempt, by name.
func (w world) attempts() map[string]string {
	return map[string]string{
		"write-work":    "write=" + filepath.Join(w.work, "out.txt"),
		"write-outside": "write=" + w.outside,
		"write-tmp":     "writetmp=",
		"read-outside":  "read=" + w.outside,
		"read-key":      "read=" + w.key,
		"read-shared":   "read=" + w.readFile,
		"read-system":   "read=/etc/passwd",
		"tcp":           "tcp=" + w.tcp,
		"udp":           "udp=" + w.udp,
		"spawn":         "spawn=/bin/true",
		"env-home":      "env=CAPGATE_TEST_HOST",
		"env-path":      "env=PATH",
		"env-secret":    "env=API_KEY",
		"env-other":     "env=OTHER_SECRET",
	}
}

// run starts the hostile tool with every attempt and returns name → "ok" or
// "denied" (with the detail after it).
func run(t *testing.T, w world, cmd *exec.Cmd) map[string]string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("run: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	byArg := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		arg, rest, _ := strings.Cut(line, " ")
		byArg[arg] = rest
	}
	got := map[string]string{}
	for name, arg := range w.attempts() {
		got[name] = byArg[arg]
	}
	return got
}

func args(w world) []string {
	var a []string
	for _, v := range w.attempts() {
		a = append(a, v)
	}
	return a
}

func launch(t *testing.T, w world, spec Spec, f Features) map[string]string {
	t.Helper()
	spec.Path, spec.Args = w.tool, args(w)
	if spec.Dir == "" {
		spec.Dir = w.work
	}
	spec.Env = []string{"PATH=/usr/bin:/bin", "CAPGATE_TEST_HOST=host", "API_KEY=leaked", "OTHER_SECRET=leaked"}
	spec.Secrets = map[string]string{"API_KEY": "k-123", "OTHER_SECRET": "o-456"}
	cmd, cleanup, err := command(spec, f)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	got := run(t, w, cmd)
	for _, k := range slices.Sorted(maps.Keys(got)) {
		t.Logf("%-13s %s", k, got[k])
	}
	return got
}

func want(t *testing.T, got map[string]string, name, verdict string) {
	t.Helper()
	if !strings.HasPrefix(got[name], verdict) {
		t.Errorf("%s: got %q, want %s", name, got[name], verdict)
	}
}

func needs(t *testing.T, f Features, g Guarantees) {
	t.Helper()
	if miss := f.Check(g); len(miss) > 0 {
		t.Skipf("this kernel cannot enforce: %v", miss)
	}
}

// TestUnconfinedControl: the hostile tool, started plainly, does every
// thing the confined runs are refused, so those refusals are the sandbox's.
func TestUnconfinedControl(t *testing.T) {
	w := newWorld(t)
	cmd := exec.Command(w.tool, args(w)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "CAPGATE_TEST_HOST=host", "API_KEY=k", "OTHER_SECRET=o"}
	got := run(t, w, cmd)
	for name := range w.attempts() {
		want(t, got, name, "ok")
	}
}

func all() Guarantees {
	g, _ := Derive(Declared{Pure: true}, Overrides{}, Declared{})
	return g
}

func guarantee(ks ...Key) Guarantees {
	g := Guarantees{Set: map[Key]bool{}, From: map[Key]Source{}}
	for _, k := range ks {
		g.tighten(k, FromDeclaration)
	}
	return g
}

// TestBaselineUndeclared: a tool that declares nothing reads and writes
// what file modes allow, but never capgate's data dir, and never its own
// files (Own); it holds no capability.
func TestBaselineUndeclared(t *testing.T) {
	f := Probe()
	needs(t, f, guarantee(NoFilesystemRead))
	w := newWorld(t)
	own := filepath.Join(filepath.Dir(w.data), "pack")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Deny: []string{w.data}, Own: []string{own}}
	spec.Path, spec.Args = w.tool, []string{"write=" + filepath.Join(own, "extension.yaml"), "write=" + filepath.Join(w.data, "planted"), "caps"}
	cmd, cleanup, err := command(spec, f)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.Contains(line, " denied ") {
			t.Errorf("undeclared: %s", line)
		}
	}
	got := launch(t, w, Spec{Deny: []string{w.data}}, f)
	want(t, got, "write-work", "ok")
	want(t, got, "write-tmp", "ok /tmp/"+runPrefix)
	want(t, got, "write-outside", "ok")
	want(t, got, "read-outside", "ok")
	want(t, got, "read-key", "denied")
	want(t, got, "tcp", "ok")
	want(t, got, "spawn", "ok")
	want(t, got, "env-home", "ok host")
	want(t, got, "env-secret", "denied") // no secret is allowed
}

// TestCarvingSurvivesVanishingEntries: the launcher lists the directories
// around a deny path and allows each entry; an entry removed before the
// trampoline applies the rules (another process's temp dir) must not fail
// the launch. It failed in CI while other tests' temp dirs came and went.
func TestCarvingSurvivesVanishingEntries(t *testing.T) {
	f := Probe()
	needs(t, f, guarantee(NoFilesystemRead))
	w := newWorld(t)
	parent := filepath.Dir(w.data)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := filepath.Join(parent, fmt.Sprintf("churn-%d", i%8))
			os.Mkdir(d, 0o755)
			os.Remove(d)
		}
	}()
	for range 20 {
		got := launch(t, w, Spec{Deny: []string{w.data}}, f)
		want(t, got, "read-key", "denied")
	}
	close(stop)
	<-done
}

// TestCarvingACrowdedDirectory: the entries listed around a deny path in a
// crowded directory (a busy /tmp) come to more than the kernel takes in
// one environment string (128 KiB); the launch still starts, with the deny
// path carved out. It failed with E2BIG while the plan travelled in the
// environment.
func TestCarvingACrowdedDirectory(t *testing.T) {
	f := Probe()
	needs(t, f, guarantee(NoFilesystemRead))
	w := newWorld(t)
	parent := filepath.Dir(w.data)
	for i := range 2500 {
		if err := os.Mkdir(filepath.Join(parent, fmt.Sprintf("crowd-%04d-%s", i, strings.Repeat("x", 60))), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := launch(t, w, Spec{Deny: []string{w.data}}, f)
	want(t, got, "read-key", "denied")
	want(t, got, "read-outside", "ok") // its content depends on write-outside's turn
}

func TestFilesystemNone(t *testing.T) {
	f := Probe()
	g := guarantee(NoFilesystemRead, NoFilesystemWrite)
	needs(t, f, g)
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: g, ReadPaths: []string{w.readDir}, Deny: []string{w.data}}, f)
	want(t, got, "write-work", "denied")
	want(t, got, "write-outside", "denied")
	want(t, got, "write-tmp", "denied")
	want(t, got, "read-outside", "denied")
	want(t, got, "read-shared", "denied") // listed, but filesystem none reads no listed path
	want(t, got, "read-key", "denied")
	want(t, got, "read-system", "ok")
}

func TestFilesystemRead(t *testing.T) {
	f := Probe()
	g := guarantee(NoFilesystemWrite)
	needs(t, f, g)
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: g, ReadPaths: []string{w.readDir}, Deny: []string{w.data}}, f)
	want(t, got, "read-shared", "ok shared-notes")
	want(t, got, "read-outside", "denied")
	want(t, got, "read-key", "denied")
	want(t, got, "write-work", "denied")
	want(t, got, "write-outside", "denied")
}

// TestDenyWinsOverListedPaths: a listed read path that holds capgate's data
// dir is carved around it.
func TestDenyWinsOverListedPaths(t *testing.T) {
	f := Probe()
	g := guarantee(NoFilesystemWrite)
	needs(t, f, g)
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: g, ReadPaths: []string{filepath.Dir(w.data)}, Deny: []string{w.data}}, f)
	want(t, got, "read-outside", "ok outside")
	want(t, got, "read-key", "denied")
}

func TestNoNetworkNamespace(t *testing.T) {
	f := Probe()
	if !f.NetNS {
		t.Skip("this kernel gives this process no network namespaces")
	}
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: guarantee(NoNetwork)}, f)
	want(t, got, "tcp", "denied")
	want(t, got, "udp", "denied")
	want(t, got, "write-work", "ok")
}

// TestNoNetworkFallback: without network namespaces, Landlock refuses TCP
// and seccomp refuses every socket but AF_UNIX.
func TestNoNetworkFallback(t *testing.T) {
	f := Probe()
	f.NetNS = false
	needs(t, f, guarantee(NoNetwork))
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: guarantee(NoNetwork)}, f)
	want(t, got, "tcp", "denied")
	want(t, got, "udp", "denied")
	want(t, got, "spawn", "ok")
}

func TestNoSubprocess(t *testing.T) {
	f := Probe()
	g := guarantee(NoSubprocess)
	needs(t, f, g)
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: g}, f)
	want(t, got, "spawn", "denied")
	want(t, got, "tcp", "ok")
}

// TestObservedDenials: with an observer, the sockets and new processes the
// kernel refuses under no_network and no_subprocess are reported to
// capgate (seccomp user notification), and still refused.
func TestObservedDenials(t *testing.T) {
	f := Probe()
	g := guarantee(NoSubprocess, NoNetwork)
	needs(t, f, g)
	w := newWorld(t)
	var mu sync.Mutex
	seen := map[Key]int{}
	got := launch(t, w, Spec{Guarantees: g, Observe: func(k Key) {
		mu.Lock()
		defer mu.Unlock()
		seen[k]++
	}}, f)
	want(t, got, "spawn", "denied")
	want(t, got, "tcp", "denied")
	want(t, got, "udp", "denied")
	want(t, got, "read-system", "ok") // the rest of the tool runs
	mu.Lock()
	defer mu.Unlock()
	// tcp and udp each make a socket; spawn one process.
	if seen[NoNetwork] < 2 || seen[NoSubprocess] < 1 {
		t.Errorf("observed %v, want no_network twice and no_subprocess", seen)
	}
}

func TestEnvironment(t *testing.T) {
	f := Probe()
	g := guarantee(NoEnvRead)
	g.SecretsAllowed = []string{"API_KEY"}
	needs(t, f, g)
	w := newWorld(t)
	got := launch(t, w, Spec{Guarantees: g}, f)
	want(t, got, "env-home", "denied")
	want(t, got, "env-path", "ok /usr/bin:/bin")
	want(t, got, "env-secret", "ok k-123")
	want(t, got, "env-other", "denied")
}

func TestUnenforceableRefused(t *testing.T) {
	w := newWorld(t)
	_, _, err := command(Spec{Path: w.tool, Guarantees: guarantee(NoSubprocess, NoFilesystemRead)}, Features{})
	ue, ok := err.(*UnenforceableError)
	if !ok || len(ue.Missing) != 2 || ue.Missing[0].Feature != "Landlock" || ue.Missing[1].Feature != "seccomp" {
		t.Fatalf("err = %v, want the two missing features", err)
	}
	_, _, err = command(Spec{Path: w.tool, Guarantees: guarantee(NoNetwork), Deny: []string{w.data}}, Features{NetNS: true, Privileged: true})
	if ue, ok := err.(*UnenforceableError); !ok || len(ue.Missing) != 1 || ue.Missing[0].Key != "deny" {
		t.Fatalf("deny paths without Landlock: err = %v, want refused", err)
	}
	// Undeclared, the baseline runs without what the kernel lacks
	// (serve says so at start).
	if _, cleanup, err := command(Spec{Path: w.tool, Deny: []string{w.data}}, Features{}); err != nil {
		t.Fatalf("undeclared without Landlock: %v", err)
	} else {
		cleanup()
	}
	if _, cleanup, err := command(Spec{Path: w.tool, Guarantees: guarantee(NoSubprocess), AllowUnsafe: true}, Features{}); err != nil {
		t.Fatalf("allow unsafe: %v", err)
	} else {
		cleanup()
	}
}

// nobodyWorld is a world that uid 65534 can reach: the binaries copied
// out of root's 0700 build dirs, a work dir it owns.
func nobodyWorld(t *testing.T, f Features) (w world, trampoline string) {
	t.Helper()
	if !f.Privileged {
		t.Skip("needs root to switch to nobody")
	}
	w = newWorld(t)
	pub, err := os.MkdirTemp("", "capgate-sandbox-pub-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	os.Chmod(pub, 0o755)
	self, _ := os.Executable()
	for _, p := range [][2]string{{self, "trampoline"}, {w.tool, "hostile"}} {
		b, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pub, p[1]), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w.tool = filepath.Join(pub, "hostile")
	w.work = filepath.Join(pub, "work")
	if err := os.Mkdir(w.work, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(w.work, 65534, 65534)
	os.Chmod(filepath.Dir(w.outside), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(w.outside)), 0o755)
	t.Cleanup(func() { os.Chmod(filepath.Dir(filepath.Dir(w.outside)), 0o700) })
	return w, filepath.Join(pub, "trampoline")
}

var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

// TestCredentialNobody: capgate as root starts a tool as nobody; the user
// namespace is made for no_network as for an unprivileged capgate.
func TestCredentialNobody(t *testing.T) {
	f := Probe()
	g := all()
	needs(t, f, g)
	if !f.UserNS {
		t.Skip("this kernel refuses unprivileged user namespaces")
	}
	w, tramp := nobodyWorld(t, f)
	// Positive control: as nobody, with no guarantees, the attempts succeed
	// where the file modes allow (outside.txt is 0644).
	base := launch(t, w, Spec{Credential: nobody, Trampoline: tramp}, f)
	for _, name := range []string{"write-work", "read-outside", "env-home", "tcp", "udp", "spawn"} {
		want(t, base, name, "ok")
	}
	got := launch(t, w, Spec{Guarantees: g, Credential: nobody, Trampoline: tramp, Deny: []string{w.data}}, f)
	for _, name := range []string{"write-work", "write-outside", "read-outside", "read-key", "tcp", "udp", "spawn", "env-home", "env-secret"} {
		want(t, got, name, "denied")
	}
	want(t, got, "read-system", "ok")
}

// launchAsEnv makes the test binary a capgate stand-in that launches the
// Spec in it (JSON) through Command and relays the tool's output.
const launchAsEnv = "CAPGATE_SANDBOX_TEST_LAUNCH"

func launchFromEnv(js string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	if os.Getenv(oldKernelEnv) != "" {
		if err := asOldKernel(&spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	cmd, cleanup, err := Command(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer cleanup()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	return 0
}

// TestUnprivilegedLauncher: capgate itself runs as nobody, with no
// capabilities: the probe sees it unprivileged, no_network takes a user
// namespace it creates itself, and Landlock and seccomp load under
// no_new_privs.
func TestUnprivilegedLauncher(t *testing.T) {
	f := Probe()
	g := all()
	needs(t, f, g)
	if !f.UserNS {
		t.Skip("this kernel refuses unprivileged user namespaces")
	}
	w, tramp := nobodyWorld(t, f)
	asNobody := func(spec Spec) map[string]string {
		t.Helper()
		spec.Path, spec.Args, spec.Dir = w.tool, args(w), w.work
		spec.Env = []string{"PATH=/usr/bin:/bin", "CAPGATE_TEST_HOST=host", "API_KEY=leaked"}
		spec.Secrets = map[string]string{"API_KEY": "k-123", "OTHER_SECRET": "o-456"}
		js, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tramp)
		cmd.Env = []string{launchAsEnv + "=" + string(js)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		got := run(t, w, cmd)
		for _, k := range slices.Sorted(maps.Keys(got)) {
			t.Logf("%-13s %s", k, got[k])
		}
		return got
	}
	base := asNobody(Spec{})
	for _, name := range []string{"write-work", "read-outside", "env-home", "tcp", "udp", "spawn"} {
		want(t, base, name, "ok")
	}
	got := asNobody(Spec{Guarantees: g, Deny: []string{w.data}})
	for _, name := range []string{"write-work", "write-outside", "read-outside", "read-key", "tcp", "udp", "spawn", "env-home", "env-secret"} {
		want(t, got, name, "denied")
	}
	want(t, got, "read-system", "ok")
}

// TestConfinedInAContainer: capgate in a PID namespace with a /proc of its
// own, as in most containers. There the host's /proc no longer named the
// trampoline's PID in the tool's namespace, and go-landlock (cgo, libpsx)
// refused to start every filesystem-confined tool: "populating ruleset for
// /proc/7/task". The tool's namespace now mounts its own /proc. This runs
// TestFilesystemRead again inside such a namespace.
func TestConfinedInAContainer(t *testing.T) {
	if os.Getenv("CAPGATE_TEST_IN_CONTAINER") != "" {
		t.Skip("already inside")
	}
	f := Probe()
	needs(t, f, guarantee(NoFilesystemWrite))
	if !f.PidNS || os.Geteuid() != 0 {
		t.Skip("needs root and PID namespaces")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("unshare (util-linux) is missing")
		}
		t.Skip("no unshare")
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", os.Args[0], "-test.run", "^TestFilesystemRead$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPGATE_TEST_IN_CONTAINER=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFilesystemRead") {
		t.Fatalf("TestFilesystemRead in a PID namespace with its own /proc: %v\n%s", err, out)
	}
}
