package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestConfigCheckReportsEverything: the real capgate binary's config check
// reports every problem of a config in one run, in the file's order, each
// at its own line (a bad list element at the element's), with the nearest
// known key or value for a mistyped one; a syntax error, after which
// nothing can be read, is reported alone at its line.
func TestConfigCheckReportsEverything(t *testing.T) {
	t.Parallel()
	bin := testkit.Build(t, testkit.CapgatePkg)
	check := func(src string) (string, int) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "capgate.toml")
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "config", "check", "--config", path)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(out), path, "FILE"), code
	}

	out, code := check(`[server]
listne = "127.0.0.1:9000"

[policy]
grants = [
  "rye.fetch.*",
  5,
]
acknowlege = ["elevated"]
approval_wait = "soon"

[policy.subjects.alice]
grants = [
  "rye.execute.tool.*",
  "not a grant",
]

[policy.side_effects]
"fs.delte" = "deny"
"payments" = "acknowlege"

[discovery]
mode = "serach"

[mcp.servers.fs]
comand = "npx"
`)
	want := []string{
		"FILE:2: server.listne: unknown key (did you mean listen?)",
		"FILE:7: policy.grants[1]: is a TOML integer; want a string",
		"FILE:9: policy.acknowlege: unknown key (did you mean acknowledge?)",
		`FILE:10: policy.approval_wait: "soon" is not a duration such as "30s" or "2m"`,
		`FILE:15: policy.subjects.alice.grants[1]: grant "not a grant" contains white space or a control character`,
		`FILE:19: policy.side_effects."fs.delte": unknown side effect "fs.delte": valid side effects are`,
		`FILE:20: policy.side_effects."payments": unknown side-effect policy "acknowlege": want allow, acknowledge or deny (did you mean acknowledge?)`,
		`FILE:23: discovery.mode: "serach": want "list", "search" or "auto" (did you mean search?)`,
		"FILE:25: mcp.servers.fs.command: required (or url)", // at its table: the key is not written
		"FILE:26: mcp.servers.fs.comand: unknown key (did you mean command?)",
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 2 || len(lines) != len(want) {
		t.Fatalf("exit %d, %d problems, want 2 and %d:\n%s", code, len(lines), len(want), out)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d:\n got %s\nwant %s", i+1, lines[i], w)
		}
	}
	if !strings.Contains(lines[5], "(did you mean fs.delete?)") {
		t.Errorf("no suggestion for the mistyped tag: %s", lines[5])
	}

	// A syntax error: that one problem, at its line.
	out, code = check("[server]\nlistne = 1\n[policy\ngrants = []\n")
	if code != 2 || strings.TrimSpace(out) != "FILE:3: expected ']' to close table name" {
		t.Errorf("syntax error: exit %d\n%s", code, out)
	}
}
