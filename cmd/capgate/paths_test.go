//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// TestDeclaredPathsAsRoot: through a root capgate serve, a command
// declaring filesystem read with read_paths reads those and nothing else
// outside its own dirs; one declaring write with write_paths writes there
// and nowhere else; a stdio MCP server whose start its sandbox refuses
// (it may not read its script) is reported by name with its stderr tail,
// a credential in it withheld, at start and in the error its calls get.
func TestDeclaredPathsAsRoot(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestDeclaredPathsUnprivileged covers this user")
	}
	declaredPaths(t, nil)
}

// TestDeclaredPathsUnprivileged is the same with serve running as nobody.
func TestDeclaredPathsUnprivileged(t *testing.T) {
	t.Parallel()
	declaredPaths(t, unprivileged())
}

func declaredPaths(t *testing.T, user *testkit.User) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	f := sandbox.Probe()
	if f.LandlockABI < 1 || (user != nil && !f.UserNS) {
		t.Skipf("this kernel cannot enforce filesystem guarantees here: %+v", f)
	}
	// Every dir is open to the tools' user by its mode (nobody's own, or
	// 0755), so each refusal below is the sandbox's.
	owned := func() string { return publicDir(t, &testkit.User{Uid: testkit.ToolUID, Gid: testkit.ToolUID}) }
	if os.Getuid() != 0 {
		owned = func() string { return publicDir(t, nil) }
	}
	dir, packs, allowed, other, w, v := publicDir(t, user), publicDir(t, nil), publicDir(t, nil), publicDir(t, nil), owned(), owned()
	writeFile(t, filepath.Join(allowed, "f"), "allowed")
	writeFile(t, filepath.Join(other, "f"), "other")
	script := filepath.Join(other, "server.sh")
	writeFile(t, script, "echo never\n")

	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	command := func(name, caps string, tries ...string) string {
		return fmt.Sprintf("  %s:\n    description: Try paths\n    run: %s\n    risk: LOW\n    side_effects: []\n    capabilities: %s\n",
			name, quoteList(append([]string{hostile, "--json"}, tries...)), caps)
	}
	readAllowed, readOther := "read="+filepath.Join(allowed, "f"), "read="+filepath.Join(other, "f")
	writeW, writeV := "write="+filepath.Join(w, "x"), "write="+filepath.Join(v, "x")
	writeFile(t, filepath.Join(packs, "paths", "extension.yaml"), "id: paths\nname: Paths\ndescription: Paths\ncommands:\n"+
		command("reader", fmt.Sprintf("{filesystem: read, read_paths: [%q]}", allowed), readAllowed, readOther, writeW)+
		command("writer", fmt.Sprintf("{filesystem: write, write_paths: [%q]}", w), writeW, writeV))
	const key = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"
	cg := testkit.StartCapgate(t, testkit.Capgate{User: user, Dir: dir, Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

# It may read only system dirs and its own: not its script.
[mcp.servers.broken]
command = "/bin/sh"
args = ["-c", "echo 'starting with api_key=%s' >&2; . %s || exit 3"]
capabilities = { filesystem = "read", network = "none" }
`, packs, key, script)})
	s := fromCapgate(cg)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	invoke := invoker(t, s, tok)

	out := invoke("ext:paths:reader")
	if !strings.Contains(out, fmt.Sprintf("%q: \"ok", readAllowed)) {
		t.Errorf("read_paths did not let the tool read %s:\n%s", allowed, out)
	}
	for _, a := range []string{readOther, writeW} {
		if !strings.Contains(out, fmt.Sprintf("%q: \"denied", a)) {
			t.Errorf("filesystem read with read_paths let the tool %s:\n%s", a, out)
		}
	}
	out = invoke("ext:paths:writer")
	if !strings.Contains(out, fmt.Sprintf("%q: \"ok", writeW)) || !strings.Contains(out, fmt.Sprintf("%q: \"denied", writeV)) {
		t.Errorf("write_paths: want %s written and %s refused:\n%s", w, v, out)
	}

	// The refused server: named at start with its stderr, the key withheld.
	refusal := "cannot open " + script
	if !testkit.Poll(10e9, func() bool { return strings.Contains(s.logs(), refusal) }) {
		t.Errorf("serve did not log why mcp server broken would not start:\n%s", s.logs())
	}
	outb, errb, code := s.as(t, tok, "invoke", "--capability", "mcp:broken:echo")
	for _, want := range []string{"capability_backend_unavailable", "mcp:broken is down", "its stderr ends:", refusal,
		"[a line withheld: it holds"} {
		if code == 0 || !strings.Contains(errb, want) {
			t.Errorf("a call of the refused server's tool lacks %q: %d\n%s%s", want, code, outb, errb)
		}
	}
	t.Logf("the call's error: %s", errb)
	// Over MCP, by its exposed name, on both protocols: the same error,
	// not capability_not_found.
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"broken__echo","arguments":{"message":"hi"}%s}}`
	_, _, stateless := testkit.PostMCP(t, cg.URL, tok, "broken__echo", fmt.Sprintf(call, ","+modernMeta))
	_, _, session := testkit.PostSession(t, cg.URL, tok, testkit.OpenSession(t, cg.URL, tok, `{}`), fmt.Sprintf(call, ""))
	for proto, body := range map[string][]byte{"2026-07-28": stateless, "2025-11-25": session} {
		for _, want := range []string{"capability_backend_unavailable", "mcp:broken is down", "its stderr ends:", refusal, "[a line withheld: it holds"} {
			if !strings.Contains(string(body), want) {
				t.Errorf("over MCP %s, a call of the refused server's tool lacks %q:\n%s", proto, want, body)
			}
		}
		if strings.Contains(string(body), key) {
			t.Errorf("over MCP %s, the credential in the server's stderr reached the caller", proto)
		}
	}
	if strings.Contains(errb, key) || strings.Contains(s.logs(), key) {
		t.Errorf("the credential in the server's stderr reached the caller or the log")
	}
}

// TestLoosenedPackIsQuarantined: a locked extension command whose pack is
// rewritten to drop its capabilities (and, apart, to run another
// program) is quarantined by the reload that would have loosened it: its
// calls are refused (capability_access_denied, gate definition_pin) and
// serve logs what changed, instead of running it unconfined.
func TestLoosenedPackIsQuarantined(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if sandbox.Probe().LandlockABI < 1 {
		t.Skip("needs Landlock for the declared guarantees")
	}
	packs := publicDir(t, nil)
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	manifest := func(caps string) string {
		return fmt.Sprintf("id: probe\nname: Probe\ndescription: Probe\ncommands:\n  p:\n    description: Read\n    run: [%q, \"--json\", \"id\"]\n    risk: LOW\n    side_effects: []\n%s",
			hostile, caps)
	}
	yaml := filepath.Join(packs, "probe", "extension.yaml")
	writeFile(t, yaml, manifest("    capabilities: {filesystem: none, network: none}\n"))
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(
		"[policy]\nrequire_lock = true\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[extensions]\npaths = [%q]\n", packs)})
	s := fromCapgate(cg)
	if out, errb, code := s.run(t, nil, "tools", "lock", "--config", s.config); code != 0 {
		t.Fatalf("tools lock: %d %s %s", code, out, errb)
	}
	reload := func(n int) {
		t.Helper()
		if out, errb, code := s.run(t, nil, "reload", "--config", s.config); code != 0 {
			t.Fatalf("reload: %d %s %s", code, out, errb)
		}
		if !testkit.Poll(20e9, func() bool { return strings.Count(s.logs(), "reload applied") >= n }) {
			t.Fatalf("the reload was not applied:\n%s", s.logs())
		}
	}
	reload(1)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	if out := invoker(t, s, tok)("ext:probe:p"); !strings.Contains(out, `"id": "ok`) {
		t.Fatalf("the locked command does not run: %s", out)
	}

	writeFile(t, yaml, manifest("")) // its capabilities deleted
	reload(2)
	out, errb, code := s.as(t, tok, "invoke", "--capability", "ext:probe:p")
	if code == 0 || !strings.Contains(errb, "capability_access_denied") || !strings.Contains(errb, "its run, program or declared guarantees changed") {
		t.Errorf("a locked command whose capabilities were deleted still runs after a reload: %d %s %s", code, out, errb)
	}
	if !strings.Contains(s.logs(), `msg="tool quarantined" tool=ext:probe:p why="its run, program or declared guarantees changed`) {
		t.Errorf("serve did not log what changed:\n%s", s.logs())
	}
}

// TestBridgeDenialNamesTheGuarantee: a bridge provider declaring network
// none connects anyway and gives up (exit 254); the caller's error names
// the guarantee the kernel refused and the declaration that would allow it.
func TestBridgeDenialNamesTheGuarantee(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); !f.Seccomp || !f.NetNS {
		t.Skipf("this kernel cannot observe denials here: %+v", f)
	}
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(
		"[policy]\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[capabilities.providers.gog]\ncommand = [%q]\ncapabilities = { network = \"none\" }\n",
		testkit.Build(t, testkit.BridgeFixture))})
	s := fromCapgate(cg)
	out, errb, code := s.as(t, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "invoke", "--capability", "gog.calendar",
		"--operation", "list_events", "--input-json", fmt.Sprintf(`{"attempt_or_fail":%q}`, "tcp="+helloServer(t)))
	t.Logf("%s", errb)
	for _, want := range []string{"capability_backend_unavailable", "command failed with exit 254",
		"the kernel refused it a socket (no_network, set by tool)",
		"declare network: outbound in capabilities of [capabilities.providers.gog]"} {
		if code == 0 || !strings.Contains(errb, want) {
			t.Errorf("the caller's error lacks %q: %d\n%s%s", want, code, out, errb)
		}
	}
}
