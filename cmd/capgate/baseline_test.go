//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestBaselineUnprivileged covers this user")
	}
	baseline(t, nil)
}

// TestBaselineUnprivileged is the same with capgate serve running as an
// unprivileged user, whose tools run as that user too.
func TestBaselineUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		baseline(t, nil) // this user is unprivileged already
		return
	}
	baseline(t, &testkit.User{Uid: 65534, Gid: 65534})
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
	abstract := fmt.Sprintf("@capgate-baseline-%d", os.Getpid())
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
	openTries := []string{"parentenv", "caps", "read=" + key, "read=" + config, "read=" + auditLog,
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
