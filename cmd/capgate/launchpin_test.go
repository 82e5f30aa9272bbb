//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// TestLaunchPinsHoldForEverySource: under require_lock, capgate.lock pins
// how a stdio MCP server, a bridge provider and an extension command start
// (run, program sha256, declared guarantees). Reloads through a real serve
// (as root here): one that only adds guarantees keeps every tool callable
// (each now runs tighter); one that drops the server's no_network, and one
// whose provider program changed on disk, quarantine those tools, refused
// with the change named in the caller's error and in serve's log, and
// neither process is started again (each writes a marker outside its pack
// when it starts: none is written after that reload).
func TestLaunchPinsHoldForEverySource(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestLaunchPinsHoldUnprivileged covers this user")
	}
	launchPins(t, nil)
}

// TestLaunchPinsHoldUnprivileged is the same with capgate serve running as
// an unprivileged user.
func TestLaunchPinsHoldUnprivileged(t *testing.T) {
	t.Parallel()
	launchPins(t, unprivileged())
}

func launchPins(t *testing.T, user *testkit.User) {
	markers, dir := pinDirs(t, user)
	serverRan, providerRan := filepath.Join(markers, "server.pid"), filepath.Join(markers, "provider.ran")
	bins := publicDir(t, nil)
	server, provider := filepath.Join(bins, "server"), filepath.Join(bins, "provider")
	copyProgram(t, testkit.Build(t, testkit.MCPFixture), server)
	copyProgram(t, testkit.Build(t, testkit.BridgeFixture), provider)
	packs := publicDir(t, nil)
	yaml := filepath.Join(packs, "probe", "extension.yaml")
	manifest := func(caps string) string {
		return "id: probe\nname: Probe\ndescription: Probe\ncommands:\n  p:\n    description: Say hi\n    run: [\"/bin/echo\", \"{}\"]\n    risk: LOW\n    side_effects: []\n    capabilities: " + caps + "\n"
	}
	writeFile(t, yaml, manifest("{network: none}"))
	config := func(serverCaps, providerCaps string) string {
		return fmt.Sprintf(`[policy]
require_lock = true
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%[1]q]

[mcp.servers.files]
command = %[2]q
risk = "LOW"
capabilities = { %[3]s, filesystem = "write", write_paths = [%[7]q] }
env = { FIXTURE_PID_FILE = %[4]q }

[capabilities.providers.gog]
command = [%[5]q]
capabilities = { %[6]s, filesystem = "write", write_paths = [%[7]q] }
env = ["BRIDGE_FIXTURE_RAN"]
`, packs, server, serverCaps, serverRan, provider, providerCaps, markers)
	}
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config(`network = "none"`, `network = "none"`),
		User: user, Dir: dir, Env: []string{"BRIDGE_FIXTURE_RAN=" + providerRan}})
	s, reload := lockedServe(t, cg)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	call := map[string][]string{
		"mcp:files:echo":                  {"mcp:files:echo", "--input-json", `{"message":"hi"}`},
		"bridge:gog:calendar.list_events": {"gog.calendar", "--operation", "list_events"},
		"ext:probe:p":                     {"ext:probe:p"},
	}
	runs := func(id string) (bool, string) {
		out, errb, code := s.as(t, tok, append([]string{"invoke", "--capability"}, call[id]...)...)
		return code == 0, out + errb
	}
	reload(config(`network = "none"`, `network = "none"`))
	for _, m := range []string{serverRan, providerRan} {
		if _, err := os.Stat(m); err != nil {
			t.Fatalf("the marker of a started process is missing (the test would prove nothing): %v", err)
		}
	}
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Fatalf("%s does not run under its pin: %s\n%s", id, out, s.logs())
		}
	}

	// Only tighter: subprocess none added everywhere, filesystem none on
	// the command. Nothing is quarantined; each runs.
	writeFile(t, yaml, manifest("{network: none, subprocess: none, filesystem: none}"))
	reload(config(`network = "none", subprocess = "none"`, `network = "none", subprocess = "none"`))
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Errorf("%s was quarantined though its guarantees only tightened: %s", id, out)
		}
		if !regexp.MustCompile(`msg="tool runs under an outdated pin" tool=` + regexp.QuoteMeta(id) +
			` note="its declared guarantees only tightened since capgate.lock pinned it \([^)]*no_subprocess added`).MatchString(s.logs()) {
			t.Errorf("serve did not say %s's pin is out of date:\n%s", id, s.logs())
		}
	}

	// Looser: the server's no_network dropped; the provider's program
	// rewritten on disk (one byte more: it still runs).
	f, err := os.OpenFile(provider, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, m := range []string{serverRan, providerRan} {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}
	reload(config(`subprocess = "none"`, `network = "none", subprocess = "none"`))
	for id, change := range map[string]string{"mcp:files:echo": "no_network dropped", "bridge:gog:calendar.list_events": "program sha256 "} {
		ok, out := runs(id)
		if ok || !strings.Contains(out, "capability_access_denied") || !strings.Contains(out, change) {
			t.Errorf("%s still runs after a reload that loosened its launch (%s): %s", id, change, out)
		}
		if !strings.Contains(s.logs(), fmt.Sprintf(`msg="tool quarantined" tool=%s why="its run, program or declared guarantees changed since capgate.lock pinned it (`, id)) ||
			!strings.Contains(s.logs(), change) {
			t.Errorf("serve did not log that %s is quarantined for %s:\n%s", id, change, s.logs())
		}
	}
	if ok, out := runs("ext:probe:p"); !ok {
		t.Errorf("the unchanged command was quarantined with the others: %s", out)
	}
	// Neither changed process was started to list its tools.
	for _, m := range []string{serverRan, providerRan} {
		if _, err := os.Stat(m); !os.IsNotExist(err) {
			t.Errorf("capgate started %s after its launch loosened (%v)", filepath.Base(m), err)
		}
	}
	for _, source := range []string{"mcp:files", "bridge:gog"} {
		if !strings.Contains(s.logs(), `msg="not started: its run, program or declared guarantees changed since capgate.lock pinned it; `) ||
			!strings.Contains(s.logs(), "source="+source) {
			t.Errorf("serve did not log that it left %s unstarted:\n%s", source, s.logs())
		}
	}
	// tools list, which starts the sources as serve does, names them
	// quarantined and starts neither.
	out, errb, _ := s.run(t, nil, "tools", "list", "--config", s.config)
	for _, name := range []string{"files__echo", "gog__calendar_list_events"} {
		if !regexp.MustCompile(regexp.QuoteMeta(name) + `\s.*quarantined`).MatchString(out) {
			t.Errorf("tools list does not show %s quarantined:\n%s\n%s", name, out, errb)
		}
	}
	if _, err := os.Stat(serverRan); !os.IsNotExist(err) {
		t.Errorf("tools list started the server whose launch loosened (%v)", err)
	}
}

// pinDirs skips unless the kernel enforces the declared guarantees, and
// makes the dir the tools write their markers into (write_paths: they run
// as nobody under a root serve, as serve's user otherwise) and, for an
// unprivileged serve, its own dir.
func pinDirs(t *testing.T, user *testkit.User) (markers, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 || !f.Seccomp || (user != nil && !f.UserNS) {
		t.Skipf("needs Landlock and seccomp for the declared guarantees: %+v", f)
	}
	toolUser := user
	if os.Getuid() == 0 {
		toolUser = &testkit.User{Uid: testkit.ToolUID, Gid: testkit.ToolUID}
	}
	if user != nil {
		dir = publicDir(t, user)
	}
	return publicDir(t, toolUser), dir
}

// lockedServe pins cg's tools (`capgate tools lock`) and returns reload,
// which replaces the config after its [server] table with cfg, reloads
// serve and waits until the reload is applied.
func lockedServe(t *testing.T, cg *testkit.Served) (*served, func(cfg string)) {
	t.Helper()
	head, _, _ := strings.Cut(readFile(t, cg.ConfigPath), "[policy]")
	s := fromCapgate(cg)
	// tools lock skips (and does not pin) the tools of a source that did
	// not answer it in time, a stdio server slow to start on a loaded
	// machine: lock again until every tool is pinned.
	var lockOut string
	if !testkit.Poll(60e9, func() bool {
		out, errb, code := s.run(t, nil, "tools", "lock", "--json", "--config", s.config)
		if code != 0 {
			t.Fatalf("tools lock: %d %s %s", code, out, errb)
		}
		var res struct{ Skipped []string }
		lockOut = out + errb
		return json.Unmarshal([]byte(out), &res) == nil && len(res.Skipped) == 0
	}) {
		t.Fatalf("tools lock never pinned every tool: %s", lockOut)
	}
	reloads := 0
	return s, func(cfg string) {
		t.Helper()
		writeFile(t, cg.ConfigPath, head+cfg)
		reloads++
		if out, errb, code := s.run(t, nil, "reload", "--config", s.config); code != 0 {
			t.Fatalf("reload: %d %s %s", code, out, errb)
		}
		if !testkit.Poll(30e9, func() bool { return strings.Count(s.logs(), "reload applied") >= reloads }) {
			t.Fatalf("reload %d was not applied:\n%s", reloads, s.logs())
		}
	}
}

// TestScriptPins: capgate.lock pins the files a run names by their sha256
// (`/bin/sh run.sh`: run.sh), as it pins the program. Through a real serve
// (as root here): after a stdio MCP server's script and an extension
// command's script are rewritten and serve reloads, both tools are
// quarantined naming the changed file, the server is not started, and
// neither rewritten script ever runs (each writes a marker outside its
// pack when it runs).
func TestScriptPins(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestScriptPinsUnprivileged covers this user")
	}
	scriptPins(t, nil)
}

// TestScriptPinsUnprivileged is the same with serve running as an
// unprivileged user.
func TestScriptPinsUnprivileged(t *testing.T) {
	t.Parallel()
	scriptPins(t, unprivileged())
}

func scriptPins(t *testing.T, user *testkit.User) {
	markers, dir := pinDirs(t, user)
	serverRan, extRan := filepath.Join(markers, "server.ran"), filepath.Join(markers, "ext.ran")
	work, packs := publicDir(t, nil), publicDir(t, nil)
	fixture := filepath.Join(work, "server")
	copyProgram(t, testkit.Build(t, testkit.MCPFixture), fixture)
	runSh := filepath.Join(work, "run.sh")
	hiSh := hiPack(t, packs, markers, extRan)
	scripts := func(version string) {
		writeFile(t, runSh, fmt.Sprintf("echo %s >> %q\nexec %q\n", version, serverRan, fixture))
		hiSh(version)
	}
	scripts("v1")
	config := fmt.Sprintf(`[policy]
require_lock = true
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

[mcp.servers.files]
command = "/bin/sh"
args = ["run.sh"]
cwd = %q
risk = "LOW"
capabilities = { network = "none", filesystem = "write", write_paths = [%q] }
`, packs, work, markers)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config, User: user, Dir: dir})
	s, reload := lockedServe(t, cg)
	reload(config)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	call := map[string][]string{
		"mcp:files:echo": {"mcp:files:echo", "--input-json", `{"message":"hi"}`},
		"ext:probe:hi":   {"ext:probe:hi"},
	}
	runs := func(id string) (bool, string) {
		out, errb, code := s.as(t, tok, append([]string{"invoke", "--capability"}, call[id]...)...)
		return code == 0, out + errb
	}
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Fatalf("%s does not run under its pin: %s\n%s", id, out, s.logs())
		}
	}
	for _, m := range []string{serverRan, extRan} {
		if b, err := os.ReadFile(m); err != nil || !strings.Contains(string(b), "v1") {
			t.Fatalf("the script did not leave its marker (the test would prove nothing): %q %v", b, err)
		}
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}

	// The scripts rewritten; the launches (/bin/sh and its arguments)
	// and the declarations unchanged.
	scripts("v2")
	reload(config)
	for id, file := range map[string]string{"mcp:files:echo": "run.sh", "ext:probe:hi": "hi.sh"} {
		ok, out := runs(id)
		if ok || !strings.Contains(out, "capability_access_denied") || !strings.Contains(out, "file "+file+" sha256 ") {
			t.Errorf("%s runs after its script %s changed: %s", id, file, out)
		}
		if !strings.Contains(s.logs(), fmt.Sprintf(`msg="tool quarantined" tool=%s why="its run, program or declared guarantees changed since capgate.lock pinned it (file %s sha256 `, id, file)) {
			t.Errorf("serve did not log that %s is quarantined for %s:\n%s", id, file, s.logs())
		}
	}
	if !regexp.MustCompile(`msg="not started: [^"]*" source=mcp:files changes="file run.sh sha256 `).MatchString(s.logs()) {
		t.Errorf("serve did not log that it left the server unstarted:\n%s", s.logs())
	}
	for _, m := range []string{serverRan, extRan} {
		if b, err := os.ReadFile(m); !os.IsNotExist(err) {
			t.Errorf("a rewritten script ran: %s %q (%v)", filepath.Base(m), b, err)
		}
	}
}

// hiPack writes pack probe under packs, whose command hi runs
// `/bin/sh hi.sh` and may write markers, and returns what writes hi.sh:
// a script that appends version to marker when it runs.
func hiPack(t *testing.T, packs, markers, marker string) func(version string) {
	t.Helper()
	writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), fmt.Sprintf(`id: probe
name: Probe
description: Probe
commands:
  hi:
    description: Say hi
    run: ["/bin/sh", "hi.sh"]
    risk: LOW
    side_effects: []
    capabilities: {network: none, filesystem: write, write_paths: [%q]}
`, markers))
	return func(version string) {
		writeFile(t, filepath.Join(packs, "probe", "hi.sh"), fmt.Sprintf("echo %s >> %q\ncat >/dev/null\necho '{\"ok\": true}'\n", version, marker))
	}
}

func copyProgram(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRewrittenWithoutReload: capgate.lock's launch pins hold at every
// start, not only when serve builds its sources. Through a real serve (as
// root here): an extension command's script and a bridge provider's
// program are rewritten on disk and serve is NOT reloaded; the next call
// of each is refused (capability_access_denied, the changed file named,
// in the judge's wording) and logged, and neither rewritten program runs
// (each leaves a marker outside its pack when it runs). Put back as
// pinned, both run again.
func TestRewrittenWithoutReload(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root; TestRewrittenWithoutReloadUnprivileged covers this user")
	}
	rewrittenWithoutReload(t, nil)
}

// TestRewrittenWithoutReloadUnprivileged is the same with serve running
// as an unprivileged user.
func TestRewrittenWithoutReloadUnprivileged(t *testing.T) {
	t.Parallel()
	rewrittenWithoutReload(t, unprivileged())
}

func rewrittenWithoutReload(t *testing.T, user *testkit.User) {
	markers, dir := pinDirs(t, user)
	extRan, providerRan := filepath.Join(markers, "ext.ran"), filepath.Join(markers, "provider.ran")
	bins, packs := publicDir(t, nil), publicDir(t, nil)
	provider := filepath.Join(bins, "provider")
	copyProgram(t, testkit.Build(t, testkit.BridgeFixture), provider)
	pinnedProvider := readFile(t, provider)
	script := hiPack(t, packs, markers, extRan)
	script("v1")
	config := fmt.Sprintf(`[policy]
require_lock = true
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

[capabilities.providers.gog]
command = [%q]
capabilities = { network = "none", filesystem = "write", write_paths = [%q] }
env = ["BRIDGE_FIXTURE_RAN"]
`, packs, provider, markers)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config, User: user, Dir: dir,
		Env: []string{"BRIDGE_FIXTURE_RAN=" + providerRan}})
	s, reload := lockedServe(t, cg)
	reload(config)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	call := map[string][]string{
		"ext:probe:hi":                    {"ext:probe:hi"},
		"bridge:gog:calendar.list_events": {"gog.calendar", "--operation", "list_events"},
	}
	runs := func(id string) (bool, string) {
		out, errb, code := s.as(t, tok, append([]string{"invoke", "--capability"}, call[id]...)...)
		return code == 0, out + errb
	}
	ranSince := func() {
		t.Helper()
		for _, m := range []string{extRan, providerRan} {
			if _, err := os.Stat(m); err != nil {
				t.Fatalf("a pinned program did not leave its marker (the test would prove nothing): %v", err)
			}
			if err := os.Remove(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Fatalf("%s does not run under its pin: %s\n%s", id, out, s.logs())
		}
	}
	ranSince()

	// Rewritten on disk, serve not reloaded.
	script("v2")
	f, err := os.OpenFile(provider, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	source := map[string]string{"ext:probe:hi": "ext:probe:hi", "bridge:gog:calendar.list_events": "bridge:gog"}
	for id, change := range map[string]string{"ext:probe:hi": "file hi.sh sha256 ", "bridge:gog:calendar.list_events": "program sha256 "} {
		ok, out := runs(id)
		if ok || !strings.Contains(out, "capability_access_denied") || !strings.Contains(out, change) ||
			!strings.Contains(out, "changed since capgate.lock pinned it") {
			t.Errorf("%s runs after it was rewritten on disk (%s), without a reload: %s", id, change, out)
		}
		logged := regexp.MustCompile(`msg="not started: its run, program or declared guarantees changed since capgate.lock pinned it; [^"]*" tool=` +
			regexp.QuoteMeta(source[id]) + ` changes="[^"]*` + regexp.QuoteMeta(change))
		if !testkit.Poll(10e9, func() bool { return logged.MatchString(s.logs()) }) {
			t.Errorf("serve did not log the refused start of %s naming %s:\n%s", id, change, s.logs())
		}
	}
	for _, m := range []string{extRan, providerRan} {
		if b, err := os.ReadFile(m); !os.IsNotExist(err) {
			t.Errorf("a program rewritten after it was pinned ran: %s %q (%v)", filepath.Base(m), b, err)
		}
	}

	// As pinned again: both run.
	script("v1")
	writeFile(t, provider, pinnedProvider)
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Errorf("%s does not run once its files are as pinned again: %s", id, out)
		}
	}
	ranSince()
}

// TestRewrittenServerNotRestarted: a pinned stdio MCP server whose script
// is rewritten on disk and which capgate then restarts (an answer over
// max_result_bytes) is not restarted with the new script, without a reload: the call gets
// capability_access_denied naming run.sh, and the script never runs
// again (it leaves a marker each time it runs).
func TestRewrittenServerNotRestarted(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("runs serve as root")
	}
	markers, dir := pinDirs(t, nil)
	serverRan := filepath.Join(markers, "server.ran")
	work := publicDir(t, nil)
	fixture := filepath.Join(work, "server")
	copyProgram(t, testkit.Build(t, testkit.MCPFixture), fixture)
	runSh := filepath.Join(work, "run.sh")
	script := func(version string) {
		writeFile(t, runSh, fmt.Sprintf("echo %s >> %q\nexec %q\n", version, serverRan, fixture))
	}
	script("v1")
	config := fmt.Sprintf(`[policy]
require_lock = true
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[mcp.servers.files]
command = "/bin/sh"
args = ["run.sh"]
cwd = %q
risk = "LOW"
capabilities = { network = "none", filesystem = "write", write_paths = [%q] }
max_result_bytes = 65536
env = { MCPFIXTURE_BOUNDS = "1" }
`, work, markers)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config, Dir: dir})
	s, reload := lockedServe(t, cg)
	reload(config)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	runs := func(name, input string) (bool, string) {
		out, errb, code := s.as(t, tok, "invoke", "--capability", "mcp:files:"+name, "--input-json", input)
		return code == 0, out + errb
	}
	if ok, out := runs("echo", `{"message":"hi"}`); !ok {
		t.Fatalf("the server does not run under its pin: %s\n%s", out, s.logs())
	}
	if err := os.Remove(serverRan); err != nil {
		t.Fatalf("the script left no marker (the test would prove nothing): %v", err)
	}
	// Rewritten, then an answer over max_result_bytes: capgate restarts
	// the server at once, and the restart is the start that is checked.
	script("v2")
	if _, out := runs("big", `{"bytes": 200000}`); !strings.Contains(out, "capability_invalid_output") {
		t.Fatalf("the oversized answer did not trip the limit: %s", out)
	}
	refused := regexp.MustCompile(`msg="not started: [^"]*" tool=mcp:files changes="file run.sh sha256 `)
	if !testkit.Poll(30e9, func() bool { return refused.MatchString(s.logs()) }) {
		t.Fatalf("serve did not refuse to restart the server with its rewritten script:\n%s", s.logs())
	}
	if ok, out := runs("echo", `{"message":"hi"}`); ok || !strings.Contains(out, "capability_access_denied") || !strings.Contains(out, "file run.sh sha256 ") {
		t.Errorf("the server's tool runs after its script was rewritten: %s", out)
	}
	if b, err := os.ReadFile(serverRan); !os.IsNotExist(err) {
		t.Errorf("the rewritten script ran: %q (%v)", b, err)
	}
}
