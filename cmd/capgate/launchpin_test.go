//go:build linux

package main

import (
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
// (run, program sha256, declared guarantees). Reloads through a real serve:
// one that only adds guarantees keeps every tool callable (each now runs
// tighter); one that drops the server's no_network, and one whose provider
// program changed on disk, quarantine those tools, refused with the change
// named in the caller's error and in serve's log.
func TestLaunchPinsHoldForEverySource(t *testing.T) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 || !f.Seccomp {
		t.Skipf("needs Landlock and seccomp for the declared guarantees: %+v", f)
	}
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
paths = [%q]

[mcp.servers.files]
command = %q
risk = "LOW"
capabilities = %s

[capabilities.providers.gog]
command = [%q]
capabilities = %s
`, packs, server, serverCaps, provider, providerCaps)
	}
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config(`{ network = "none" }`, `{ network = "none" }`)})
	head, _, _ := strings.Cut(readFile(t, cg.ConfigPath), "[policy]")
	s := fromCapgate(cg)
	if out, errb, code := s.run(t, nil, "tools", "lock", "--config", s.config); code != 0 {
		t.Fatalf("tools lock: %d %s %s", code, out, errb)
	}
	reloads := 0
	reload := func(cfg string) {
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
	reload(config(`{ network = "none" }`, `{ network = "none" }`))
	for id := range call {
		if ok, out := runs(id); !ok {
			t.Fatalf("%s does not run under its pin: %s\n%s", id, out, s.logs())
		}
	}

	// Only tighter: subprocess none added everywhere, filesystem none on
	// the command. Nothing is quarantined; each runs.
	writeFile(t, yaml, manifest("{network: none, subprocess: none, filesystem: none}"))
	reload(config(`{ network = "none", subprocess = "none" }`, `{ network = "none", subprocess = "none" }`))
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
	reload(config(`{ subprocess = "none" }`, `{ network = "none", subprocess = "none" }`))
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
