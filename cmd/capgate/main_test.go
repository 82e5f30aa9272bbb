package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// cliCase runs the CLI in process and checks its exit code, key phrases
// and, as a golden file, its whole output.
type cliCase struct {
	name   string
	args   []string
	exit   int
	stdout []string // phrases stdout must contain
	stderr []string // phrases stderr must contain
}

func TestCLI(t *testing.T) {
	tests := []cliCase{
		{"version", []string{"version"}, 0, []string{"capgate ", "  go        go1."}, nil},
		{"check_allowed", []string{"check", "--grant", "rye.execute.tool.mcp.filesystem.*", "execute", "tool", "mcp:filesystem:read_file"}, 0,
			[]string{"allowed: rye.execute.tool.mcp.filesystem.read_file", "by grant rye.execute.tool.mcp.filesystem.*", "write  allow"}, nil},
		{"check_denied", []string{"check", "--grant", "rye.execute.tool.mcp.filesystem.*", "execute", "tool", "mcp:github:create_issue"}, 1,
			[]string{"denied: rye.execute.tool.mcp.github.create_issue", "no grant matches it", "to allow it, grant rye.execute.tool.mcp.github.create_issue or rye.execute.tool.mcp.github.*"}, nil},
		{"check_blocked", []string{"check", "--grant", "rye.*", "fetch", "directive"}, 1,
			[]string{"denied: rye.fetch.directive", "grant rye.* would match, but it is refused", "acknowledge unrestricted", "REFUSED"}, nil},
		{"check_acknowledged", []string{"check", "--grant", "rye.*", "--ack", "unrestricted", "fetch", "directive"}, 0,
			[]string{"allowed: rye.fetch.directive", "active, acknowledged"}, nil},
		// Rye: without <acknowledge>, an elevated grant is denied even if it matches.
		{"check_elevated_refused", []string{"check", "--grant", "rye.execute.*", "execute", "directive", "deploy"}, 1,
			[]string{"denied: rye.execute.directive.deploy", "grant rye.execute.* would match, but it is refused",
				"needs acknowledgement: acknowledge elevated", "elevated  acknowledge_required  REFUSED", "broad grant"}, nil},
		{"check_elevated_acknowledged", []string{"check", "--grant", "rye.execute.*", "--ack", "elevated", "execute", "directive", "deploy"}, 0,
			[]string{"allowed: rye.execute.directive.deploy", "elevated  acknowledge_required  active, acknowledged"}, nil},
		{"check_no_grants", []string{"check", "execute", "tool", "x"}, 1,
			[]string{"denied: rye.execute.tool.x", "no grants given (no grant means deny everything)"}, nil},
		{"check_directive_attenuates", []string{"check", "--directive", "testdata/deploy.md", "--grant", "rye.execute.tool.*", "--ack", "elevated", "execute", "tool", "mcp:github:create_issue"}, 1,
			[]string{"no grant of the directive testdata/deploy.md matches it"}, nil},
		{"check_directive_allows", []string{"check", "--directive", "testdata/deploy.md", "--grant", "rye.execute.tool.*", "--ack", "elevated", "execute", "tool", "bridge:gog:email.send"}, 0,
			[]string{"by directive grant rye.execute.tool.bridge.gog.* and grant rye.execute.tool.*"}, nil},
		{"check_directive_alone", []string{"check", "--directive", "testdata/deploy.md", "fetch", "knowledge", "mcp:docs:readme"}, 0,
			[]string{"allowed: rye.fetch.knowledge.mcp.docs.readme"}, nil},
		{"check_bad_primary", []string{"check", "--grant", "rye.*", "search", "tool"}, 2, nil,
			[]string{`unknown primary "search": valid primaries are execute, fetch, sign`}},
		{"check_bad_type", []string{"check", "execute", "tools", "x"}, 2, nil, []string{"valid item types are tool, directive, knowledge"}},
		{"check_bad_grant", []string{"check", "--grant", "rye.a b", "execute", "tool", "x"}, 2, nil, []string{"white space"}},
		{"check_bad_ack", []string{"check", "--grant", "rye.*", "--ack", "root", "execute", "tool", "x"}, 2, nil,
			[]string{`acknowledged tier "root" is not in capability_risk.yaml (built in); tiers are safe, write, elevated, unrestricted`}},
		{"check_missing_args", []string{"check", "execute"}, 2, nil, []string{"accepts between 2 and 3 arg(s)"}},
		{"check_missing_directive", []string{"check", "--directive", "testdata/nope.md", "execute", "tool", "x"}, 2, nil, []string{"testdata/nope.md", "no such file"}},
		{"check_bad_risk_file", []string{"check", "--risk-file", "testdata/deploy.md", "--grant", "rye.*", "execute", "tool", "x"}, 2, nil, []string{"testdata/deploy.md:"}},
		{"perms", []string{"perms", "testdata/deploy.md"}, 0,
			[]string{"testdata/deploy.md:10: 4 capability strings; acknowledges elevated, write", "rye.execute.tool.bridge.gog.*", "rye.fetch.*: warning: broad grant"}, nil},
		{"perms_refused", []string{"perms", "testdata/root.md"}, 1,
			[]string{"rye.*", "REFUSED", "acknowledge unrestricted"}, nil},
		{"perms_unknown_tag", []string{"perms", "testdata/broken.md"}, 2, nil,
			[]string{"testdata/broken.md:7: <permissions>: unknown tag <search> (Rye's former name; capgate calls it <fetch>); valid tags: acknowledge, execute, fetch, sign"}},
		{"perms_no_block", []string{"perms", "main.go"}, 2, nil, []string{"main.go: no <permissions> block"}},
		{"unknown_command", []string{"frobnicate"}, 2, nil, []string{`unknown command "frobnicate"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.exit {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.exit, stdout.String(), stderr.String())
			}
			for _, p := range tt.stdout {
				if !strings.Contains(stdout.String(), p) {
					t.Errorf("stdout lacks %q:\n%s", p, stdout.String())
				}
			}
			for _, p := range tt.stderr {
				if !strings.Contains(stderr.String(), p) {
					t.Errorf("stderr lacks %q:\n%s", p, stderr.String())
				}
			}
			if tt.name != "version" {
				golden(t, tt, code, stdout.String(), stderr.String())
			}
		})
	}
}

// golden compares the whole transcript with testdata/NAME.golden.
func golden(t *testing.T, tt cliCase, code int, stdout, stderr string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("$ capgate " + strings.Join(tt.args, " ") + "\n")
	b.WriteString("-- exit --\n")
	fmt.Fprintf(&b, "%d\n", code)
	b.WriteString("-- stdout --\n" + stdout)
	b.WriteString("-- stderr --\n" + stderr)
	path := filepath.Join("testdata", tt.name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if b.String() != string(want) {
		t.Errorf("transcript differs from %s (go test -update rewrites it):\ngot:\n%s\nwant:\n%s", path, b.String(), want)
	}
}

func TestCheckJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"check", "--json", "--grant", "rye.*", "--grant", "rye.fetch.*", "execute", "tool", "mcp:github:create_issue"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr.String())
	}
	var res checkResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout.String())
	}
	if res.Allowed || res.Required != "rye.execute.tool.mcp.github.create_issue" {
		t.Errorf("decision %+v", res)
	}
	if len(res.Blocked) != 1 || res.Blocked[0].Grant != "rye.*" || res.Blocked[0].Tier != "unrestricted" {
		t.Errorf("blocked %+v, want rye.* in tier unrestricted", res.Blocked)
	}
	if len(res.Grants.Grants) != 2 || res.Grants.Grants[1].Tier != "safe" {
		t.Errorf("grant tiers %+v", res.Grants.Grants)
	}
}

// TestBinary runs capgate as a new user would, as a real process (go
// build, as testkit.Build does, linked once per machine), checking exit
// statuses.
func TestBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := testkit.Build(t, testkit.CapgatePkg)
	runBin := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := runBin("version"); code != 0 || !strings.HasPrefix(out, "capgate ") {
		t.Errorf("version: %d %q", code, out)
	}
	if out, code := runBin("check", "--grant", "rye.execute.tool.mcp.fs.*", "execute", "tool", "mcp:fs:read"); code != 0 || !strings.Contains(out, "allowed") {
		t.Errorf("check allowed: %d %q", code, out)
	}
	if out, code := runBin("check", "--grant", "rye.fetch.*", "execute", "tool", "mcp:fs:read"); code != 1 || !strings.Contains(out, "denied") {
		t.Errorf("check denied: %d %q", code, out)
	}
	if out, code := runBin("check", "bogus", "tool"); code != 2 || !strings.Contains(out, "unknown primary") {
		t.Errorf("check bad input: %d %q", code, out)
	}
	if out, code := runBin("perms", "testdata/deploy.md"); code != 0 || !strings.Contains(out, "4 capability strings") {
		t.Errorf("perms: %d %q", code, out)
	}
}
