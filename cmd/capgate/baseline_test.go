//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// TestBaselineAsRoot: capgate serve runs as root, its token secret in its
// environment. A tool that declares everything none tries capgate's
// /proc/<pid>/environ, /etc/shadow and its capabilities, and Unix sockets
// (a host service's, capgate's rpc.sock, an abstract one, AF_VSOCK); a
// tool that declares nothing tries capgate's key, config and audit log
// and to write into its data dir. Every attempt fails; the same tool
// declaring network outbound reaches the host socket, so those refusals
// are the sandbox's.
func TestBaselineAsRoot(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestBaselineUnprivileged covers this user")
	}
	baseline(t, nil)
}

// TestBaselineUnprivileged is the same with capgate serve running as an
// unprivileged user, whose tools run as that user too.
func TestBaselineUnprivileged(t *testing.T) {
	t.Parallel()
	baseline(t, unprivileged())
}

func baseline(t *testing.T, user *testkit.User) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	f := sandbox.Probe()
	if f.LandlockABI < 6 || !f.Seccomp || !f.NetNS || (user != nil && !f.UserNS) {
		t.Skipf("this kernel cannot enforce the baseline and network none here: %+v", f)
	}
	// Tools run as nobody when serve is root (run_as's default), and as
	// serve's user otherwise: both must reach their dirs.
	dir, packs, public := publicDir(t, user), publicDir(t, nil), publicDir(t, nil)
	hostSock := filepath.Join(public, "host.sock")
	unixHello(t, hostSock)
	abstract := fmt.Sprintf("@capgate-baseline-%d-%s", os.Getpid(), t.Name()) // one per test: they run in parallel
	unixHello(t, abstract)
	// capgate's files, reached through links whose names output
	// hardening does not withhold: the links must not open them.
	data := filepath.Join(dir, "data")
	link := func(name, to string) string {
		t.Helper()
		p := filepath.Join(public, name)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config, key, auditLog := link("c", filepath.Join(dir, "capgate.toml")), link("k", filepath.Join(data, "token.secret")),
		link("a", filepath.Join(data, "audit.jsonl"))
	dataLink, rpcSock := link("d", data), filepath.Join(dir, "rpc.sock")
	sealedTries := []string{"parentenv", "read=/etc/shadow", "caps", "unix=" + hostSock, "unix=" + rpcSock,
		"unix=" + abstract, "vsock="}
	// /etc/shadow is root's by its mode: a root serve's undeclared tool
	// reaches it unless it runs as another user (run_as's default).
	openTries := []string{"parentenv", "caps", "read=/etc/shadow", "read=" + key, "read=" + config, "read=" + auditLog,
		"write=" + filepath.Join(dataLink, "planted"), "write=" + auditLog}

	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	command := func(name, caps string, tries []string) string {
		return fmt.Sprintf("  %s:\n    description: Try things\n    run: %s\n    risk: LOW\n    side_effects: []\n%s",
			name, quoteList(append([]string{hostile, "--json"}, tries...)), caps)
	}
	manifest := "id: probe\nname: Probe\ndescription: Hostile commands\ncommands:\n" +
		command("sealed", "    capabilities: {filesystem: none, network: none, subprocess: none, env: none}\n", sealedTries) +
		command("open", "", openTries) +
		command("outbound", "    capabilities: {network: outbound}\n", []string{"unix=" + hostSock, "id"})
	writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), manifest)
	secret := "baseline-test-secret-value-6f1e2d"
	cg := testkit.StartCapgate(t, testkit.Capgate{Secret: secret, User: user, Dir: dir, Socket: true,
		Env: []string{"CAPGATE_STORE_KEY=" + strings.Repeat("ab", 32)},
		Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]
`, packs)})
	s := fromCapgate(cg)
	invoke := invoker(t, s, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}))
	// The audit log holds this call's records by the next one.
	invoke("ext:probe:outbound")
	leaked := func(out string) bool {
		return strings.Contains(out, secret) || strings.Contains(out, strings.Repeat("ab", 32)) ||
			strings.Contains(out, "[server]") || strings.Contains(out, "root:")
	}

	out := invoke("ext:probe:sealed")
	for _, a := range sealedTries {
		if !strings.Contains(out, fmt.Sprintf("%q: \"denied", a)) || leaked(out) {
			t.Errorf("a tool declaring everything none could %s:\n%s", a, out)
		}
	}
	out = invoke("ext:probe:open")
	for _, a := range openTries {
		if !strings.Contains(out, fmt.Sprintf("%q: \"denied", a)) || leaked(out) {
			t.Errorf("a tool declaring nothing could %s:\n%s", a, out)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "planted")); err == nil {
		t.Errorf("a tool declaring nothing wrote into capgate's data dir")
	}

	// Positive control: declared outbound, the same tool reaches the host
	// socket; it runs as nobody under a root serve.
	out = invoke("ext:probe:outbound")
	if !strings.Contains(out, fmt.Sprintf("%q: \"ok hello\"", "unix="+hostSock)) {
		t.Errorf("network outbound could not reach the host socket (the test proves nothing):\n%s", out)
	}
	uid := 65534
	if user == nil && os.Getuid() != 0 {
		uid = os.Getuid()
	}
	if !strings.Contains(out, fmt.Sprintf(`"id": "ok uid=%d"`, uid)) {
		t.Errorf("the tool did not run as uid %d:\n%s", uid, out)
	}
}

// TestRunAsIsVisible: under a root serve, tools run as nobody unless the
// config says otherwise, and each choice shows. serve logs the user;
// run_as = "root" is logged as a warning (and the undeclared tool then
// reads /etc/shadow, so the opt-out is real); a pack in a dir nobody
// cannot enter is named at start.
func TestRunAsIsVisible(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("run_as applies to a root serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 {
		t.Skipf("needs Landlock for the baseline: %+v", f)
	}
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	pack := "id: probe\nname: Probe\ndescription: Probe\ncommands:\n  shadow:\n    description: Read\n    run: " +
		quoteList([]string{hostile, "--json", "read=/etc/shadow", "id"}) + "\n    risk: LOW\n    side_effects: []\n"
	serve := func(packs, extra string) (*served, func(...string) string) {
		writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), pack)
		cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(
			"[policy]\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[extensions]\npaths = [%q]\n%s", packs, extra)})
		s := fromCapgate(cg)
		return s, invoker(t, s, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}))
	}

	logged := func(s *served, want string) bool {
		return testkit.Poll(10*time.Second, func() bool { return strings.Contains(s.logs(), want) })
	}
	s, invoke := serve(publicDir(t, nil), "")
	if !logged(s, `tools run as an unprivileged user" run_as=nobody uid=65534 gid=65534`) {
		t.Errorf("serve did not say which user its tools run as:\n%s", s.logs())
	}
	if out := invoke("ext:probe:shadow"); !strings.Contains(out, `"read=/etc/shadow": "denied`) || !strings.Contains(out, `"id": "ok uid=65534"`) {
		t.Errorf("by default a root serve's tool is not nobody:\n%s", out)
	}

	s, invoke = serve(publicDir(t, nil), "\n[sandbox]\nrun_as = \"root\"\n")
	if !logged(s, "sandbox.run_as names root: every tool runs as root") {
		t.Errorf("serve did not warn that its tools run as root:\n%s", s.logs())
	}
	if out := invoke("ext:probe:shadow"); !strings.Contains(out, `"read=/etc/shadow": "ok`) || !strings.Contains(out, `"id": "ok uid=0"`) {
		t.Errorf("run_as = \"root\" did not run the tool as root:\n%s", out)
	}

	// A pack in a dir nobody cannot enter (a clone under /root) still
	// runs: the launcher enters the working dir as root, then runs the
	// program from there as nobody.
	closed := publicDir(t, nil)
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	s, invoke = serve(closed, "")
	if out := invoke("ext:probe:shadow"); !strings.Contains(out, `"id": "ok uid=65534"`) {
		t.Errorf("a pack under a 0700 dir did not run as nobody:\n%s\n%s", out, s.logs())
	}

	// A program nobody cannot reach from the pack's dir is named at start.
	packs := publicDir(t, nil)
	bin := filepath.Join(packs, "probe", "bin")
	if err := os.MkdirAll(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(hostile)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(bin, "hostile"), string(b))
	if err := os.Chmod(filepath.Join(bin, "hostile"), 0o755); err != nil {
		t.Fatal(err)
	}
	pack = "id: probe\nname: Probe\ndescription: Probe\ncommands:\n  shadow:\n    description: Read\n    run: [\"./bin/hostile\", \"id\"]\n    risk: LOW\n    side_effects: []\n"
	s, _ = serve(packs, "")
	// Its calls say why, from the launcher, as the error they get.
	_, errb, code := s.as(t, s.cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "invoke", "--capability", "ext:probe:shadow")
	if code == 0 || !strings.Contains(errb, "capability_backend_unavailable") ||
		!strings.Contains(errb, "could not start in its sandbox: capgate sandbox: exec") || !strings.Contains(errb, "as run_as 65534:65534") {
		t.Errorf("a call of the unreachable command does not say why it could not start: %d\n%s", code, errb)
	}
	if !logged(s, "extension command unreachable by the user tools run as") ||
		!logged(s, "run_as 65534:65534 cannot run "+filepath.Join(bin, "hostile")+" from "+filepath.Join(packs, "probe")+": "+bin+" is mode 0700") {
		t.Errorf("serve did not name the program nobody cannot reach:\n%s", s.logs())
	}
}

// unprivileged is the user a test's serve runs as to be unprivileged:
// nobody when this test runs as root, else this user as it is (nil).
func unprivileged() *testkit.User {
	if os.Getuid() != 0 {
		return nil
	}
	return &testkit.User{Uid: 65534, Gid: 65534}
}

// publicDir is a temp dir every user may enter, owned by user when given.
func publicDir(t *testing.T, user *testkit.User) string {
	t.Helper()
	d, err := os.MkdirTemp("", "capgate-baseline-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if user != nil {
		if err := os.Chown(d, user.Uid, user.Gid); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// unixHello listens on a Unix socket (a path anyone may connect to, or
// @name for an abstract one) and says "hello" to each connection.
func unixHello(t *testing.T, addr string) {
	t.Helper()
	name := addr
	if strings.HasPrefix(addr, "@") {
		name = "\x00" + addr[1:]
	}
	ln, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if !strings.HasPrefix(addr, "@") {
		if err := os.Chmod(addr, 0o777); err != nil {
			t.Fatal(err)
		}
	}
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
}

// TestToolDiesWithCapgate: capgate serve is killed (SIGKILL) while an
// extension command runs; the kernel ends the command too, instead of
// letting it finish its side effects without capgate.
func TestToolDiesWithCapgate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	public, packs := publicDir(t, nil), publicDir(t, nil)
	if os.Getuid() == 0 {
		if err := os.Chown(public, 65534, 65534); err != nil { // run_as nobody writes its pid here
			t.Fatal(err)
		}
	}
	// Its pid in its PID namespace (testkit.HostPID maps it to this
	// machine's).
	pidFile := filepath.Join(public, "pid")
	writeFile(t, filepath.Join(packs, "slow", "extension.yaml"), fmt.Sprintf(
		"id: slow\nname: Slow\ndescription: Slow\ncommands:\n  run:\n    description: Sleep\n    run: [\"/bin/sh\", \"-c\", \"read -r p _ < /proc/self/stat; echo $p > %s; exec sleep 60\"]\n    risk: LOW\n    side_effects: []\n    timeout: 90s\n",
		pidFile))
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(
		"[policy]\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[extensions]\npaths = [%q]\ntimeout = \"90s\"\n\n[sandbox]\nrun_as = \"nobody\"\n", packs)})
	s := fromCapgate(cg)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	call := exec.Command(s.bin, "capability", "invoke", "--capability", "ext:slow:run")
	call.Env = append(os.Environ(), "ASH_CONTEXT_TOKEN="+tok, "CAPGATE_URL=http://"+s.addr+"/rpc")
	if err := call.Start(); err != nil { // it answers only when serve dies
		t.Fatal(err)
	}
	defer call.Wait()
	var pid int
	waitFor(t, "the command to start", func() bool {
		b, err := os.ReadFile(pidFile)
		_, err2 := fmt.Sscan(string(b), &pid)
		if err != nil || err2 != nil || pid <= 0 {
			return false
		}
		pid = testkit.HostPID(pid, cg.Cmd.Process.Pid)
		return pid > 0
	})
	if err := cg.Cmd.Process.Kill(); err != nil { // serve alone, not its process group
		t.Fatal(err)
	}
	cg.Cmd.Wait()
	waitFor(t, fmt.Sprintf("the command (pid %d) to die with capgate", pid), func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Gone, or a zombie its new parent has not reaped yet.
		return err != nil || strings.Contains(string(b), ") Z ")
	})
}

// TestSecretsFromFiles: serve reads its token secret and vault key from
// files (CAPGATE_TOKEN_SECRET_FILE, and systemd's credentials directory for
// CAPGATE_STORE_KEY); tokens minted with the secret work, and neither
// value is in serve's /proc/<pid>/environ. A secret set both ways is
// refused at start, naming both.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	dir := t.TempDir()
	secret, storeKey := "file-held-token-secret-3a9c1e", strings.Repeat("cd", 32)
	secretFile, creds := filepath.Join(dir, "token.secret"), filepath.Join(dir, "creds")
	writeFile(t, secretFile, secret+"\n")
	writeFile(t, filepath.Join(creds, "CAPGATE_STORE_KEY"), storeKey)
	cg := testkit.StartCapgate(t, testkit.Capgate{NoSecret: true, Secret: secret,
		Env:    []string{"CAPGATE_TOKEN_SECRET_FILE=" + secretFile, "CREDENTIALS_DIRECTORY=" + creds},
		Config: "[policy]\ngrants = [\"rye.fetch.*\"]\n"})
	if !strings.Contains(cg.Banner, "$CAPGATE_TOKEN_SECRET") {
		t.Errorf("serve did not take its key from the file:\n%s", cg.Banner)
	}
	s := fromCapgate(cg)
	if out, errb, code := s.as(t, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "list"); code != 0 {
		t.Errorf("a token minted with the file's secret: %d %s %s", code, out, errb)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cg.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(environ), secret) || strings.Contains(string(environ), storeKey) {
		t.Errorf("a secret is in serve's environment")
	}

	both := exec.Command(cg.Bin, "serve", "--config", cg.ConfigPath)
	both.Env = []string{"CAPGATE_TOKEN_SECRET=x", "CAPGATE_TOKEN_SECRET_FILE=" + secretFile}
	out, err := both.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CAPGATE_TOKEN_SECRET is set and also read from "+secretFile) {
		t.Errorf("a secret set twice: %v\n%s", err, out)
	}
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestDenialNamesTheGuarantee: a tool declaring network none connects
// anyway and gives up (exit 254); the caller's error names the guarantee
// the kernel refused and the hint the declaration that would allow it.
func TestDenialNamesTheGuarantee(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); !f.Seccomp || !f.NetNS {
		t.Skipf("this kernel cannot observe denials here: %+v", f)
	}
	packs := publicDir(t, nil)
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), fmt.Sprintf(
		"id: probe\nname: Probe\ndescription: Probe\ncommands:\n  dial:\n    description: Connect\n    run: [%q, \"--fail\", \"tcp=%s\"]\n    risk: LOW\n    side_effects: []\n    capabilities: {network: none}\n",
		hostile, helloServer(t)))
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(
		"[policy]\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[extensions]\npaths = [%q]\n", packs)})
	s := fromCapgate(cg)
	out, errb, code := s.as(t, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "invoke", "--capability", "ext:probe:dial")
	for _, want := range []string{"capability_backend_unavailable", "exited with status 254",
		"the kernel refused it a socket (no_network, set by tool)",
		"declare network: outbound in commands.dial.capabilities of " + filepath.Join(packs, "probe", "extension.yaml")} {
		if code == 0 || !strings.Contains(errb, want) {
			t.Errorf("the caller's error lacks %q: %d\n%s%s", want, code, out, errb)
		}
	}
}

// TestCapabilitiesYamlIsNeverIgnored: a pack declaring its guarantees in
// capabilities.yaml (namel3ss's place) is refused with an error naming the
// file and where the declaration goes, instead of running unconfined.
func TestCapabilitiesYamlIsNeverIgnored(t *testing.T) {
	if testing.Short() {
		t.Skip("builds capgate")
	}
	dir := t.TempDir()
	pack := filepath.Join(dir, "packs", "probe")
	writeFile(t, filepath.Join(pack, "extension.yaml"),
		"id: probe\nname: Probe\ndescription: Probe\ncommands:\n  p:\n    description: Print\n    run: [\"/bin/echo\", \"{}\"]\n    risk: LOW\n")
	writeFile(t, filepath.Join(pack, "capabilities.yaml"), "p:\n  filesystem: none\n  network: none\n")
	cfg := filepath.Join(dir, "capgate.toml")
	writeFile(t, cfg, fmt.Sprintf("[server]\ndata_dir = \"data\"\nsocket = \"-\"\n\n[extensions]\npaths = [%q]\n", filepath.Dir(pack)))
	cmd := exec.Command(testkit.Build(t, capgatePkg), "tools", "list", "--config", cfg)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), filepath.Join(pack, "capabilities.yaml")+": capgate does not read this file") ||
		!strings.Contains(string(out), "commands.NAME.capabilities in "+filepath.Join(pack, "extension.yaml")) {
		t.Errorf("a pack with capabilities.yaml: %v\n%s", err, out)
	}
}
