package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

func TestMain(m *testing.M) {
	// Most tests here start their own capgate serve and wait on it. 4,
	// not 8: `go test ./...` is CPU-bound on 2 cores, and at 8 two of
	// three package runs failed under load (session 18).
	testkit.WaitParallel(4)
	testkit.QuietTempDirs()
	// The programs the tests here build, keyed by one go list.
	testkit.Programs(testkit.CapgatePkg, testkit.MCPFixture, testkit.BridgeFixture, testkit.TasksFixture,
		testkit.HeadersFixture, testkit.NoLandlock, testkit.ConformanceFixture, corpusFixture,
		"github.com/capgate/capgate/internal/testkit/hostile")
	testkit.Main(m)
}

func toolsConfig(t *testing.T) string {
	t.Helper()
	packs, _ := filepath.Abs("../../sources/ext/testdata/packs")
	dir := t.TempDir()
	path := filepath.Join(dir, "capgate.toml")
	src := fmt.Sprintf("[extensions]\npaths = [%q]\n\n[mcp.servers.fx]\ncommand = %q\n# our own fixture: its readOnlyHint on echo may make it LOW\ntrust_annotations = true\n\n[mcp.servers.fx.tools.echo]\nname = \"say\"\n",
		packs, testkit.Build(t, testkit.MCPFixture))
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestToolsCommands(t *testing.T) {
	t.Parallel()
	cfg := toolsConfig(t)
	runCLI := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(append(args, "--config", cfg), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, _, code := runCLI("tools", "list")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "say  ") || !strings.Contains(out, "ext:tools.echo:echo") {
		t.Fatalf("tools list: %d\n%s", code, out)
	}
	if n := strings.Count(out, "\n") - 1; n != 9+28 {
		t.Errorf("tools list printed %d tools, want 37", n)
	}
	out, _, _ = runCLI("tools", "list", "--risk-max", "LOW", "--source", "mcp")
	if !strings.Contains(out, "mcp:fx:echo") || strings.Contains(out, "mcp:fx:slow") || strings.Contains(out, "ext:") {
		t.Errorf("filtered list:\n%s", out)
	}
	out, _, _ = runCLI("tools", "search", "ECHO the input")
	if !strings.Contains(out, "ext:tools.echo:echo") || strings.Count(out, "\n") != 2 {
		t.Errorf("search:\n%s", out)
	}
	out, _, code = runCLI("tools", "show", "say")
	if code != 0 || !strings.Contains(out, `"id": "mcp:fx:echo"`) || !strings.Contains(out, `"additionalProperties": false`) {
		t.Errorf("show: %d\n%s", code, out)
	}
	out, _, code = runCLI("tools", "lock")
	if code != 0 || !strings.Contains(out, "pinned 37 tools in ") {
		t.Errorf("lock: %d %s", code, out)
	}
	lock, err := os.ReadFile(filepath.Join(filepath.Dir(cfg), "capgate.lock"))
	if err != nil || !strings.Contains(string(lock), "mcp:fx:echo sha256:") {
		t.Errorf("lock file: %v\n%s", err, lock)
	}
	out, _, _ = runCLI("tools", "list", "--available")
	if strings.Contains(out, "quarantined") {
		t.Errorf("tools quarantined right after lock:\n%s", out)
	}
	for _, bad := range [][]string{
		{"tools", "list", "--risk-max", "SEVERE"},
		{"tools", "list", "--source", "ftp"},
		{"tools", "list", "--exclude-side-effect", "fs.wipe"},
	} {
		if _, errs, code := runCLI(bad...); code != 2 || errs == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", bad, code, errs)
		}
	}
	if _, errs, code := runCLI("tools", "show", "nope"); code != 1 || !strings.Contains(errs, `no tool "nope"`) {
		t.Errorf("show nope: %d %q", code, errs)
	}
	var errb bytes.Buffer
	if code := run([]string{"tools", "list", "--config", filepath.Join(t.TempDir(), "none.toml")}, new(bytes.Buffer), &errb); code != 2 || !strings.Contains(errb.String(), "none.toml") {
		t.Errorf("missing config: %d %q", code, errb.String())
	}
}
