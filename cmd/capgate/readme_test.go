package main

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestReadmeQuickstartIsCurrent: what README.md shows of the quickstart's
// catalog is what capgate prints for it today: the banner's tool count,
// and the `tools list --risk-max LOW` output line for line.
func TestReadmeQuickstartIsCurrent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the quickstart's sources")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the quickstart's MCP server is built with go: no go on PATH")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`capgate \(devel\): (\d+) tools from examples/quickstart/capgate.toml`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no quickstart banner")
	}
	want, _ := strconv.Atoi(string(m[1]))
	block := regexp.MustCompile("(?s)--risk-max LOW\n```\n\n```\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README.md has no tools list --risk-max LOW output")
	}

	// As the quickstart's serve.sh does (go build -o examples/quickstart/bin/
	// of both fixtures: it runs its tools as nobody under root, which cannot
	// use go run), through testkit.Build, which links each once per machine.
	for _, pkg := range []string{testkit.MCPFixture, testkit.BridgeFixture} {
		dst := filepath.Join(root, "examples", "quickstart", "bin", path.Base(pkg))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		// Replaced whole (a link beside it, renamed over it): another test
		// binary may be running the one there.
		tmp := dst + ".tmp-" + strconv.Itoa(os.Getpid())
		os.Remove(tmp)
		if err := linkOrCopy(testkit.Build(t, pkg), tmp); err != nil {
			t.Fatalf("the quickstart's %s: %v", path.Base(pkg), err)
		}
		if err := os.Rename(tmp, dst); err != nil {
			os.Remove(tmp)
			t.Fatalf("the quickstart's %s: %v", path.Base(pkg), err)
		}
	}
	bin := testkit.Build(t, capgatePkg)
	list := func(args ...string) (string, string) {
		cmd := exec.Command(bin, append([]string{"tools", "list", "--config", "examples/quickstart/capgate.toml"}, args...)...)
		cmd.Dir = root // as the README runs it
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("capgate tools list %v: %v\n%s", args, err, stderr.String())
		}
		return string(out), stderr.String()
	}
	out, stderr := list()
	all := strings.Split(strings.TrimSpace(out), "\n")
	if got := len(all) - 1; got != want { // less the header
		t.Errorf("README.md says the quickstart serves %d tools; it serves %d:\n%s\nstderr:\n%s", want, got, strings.Join(all, "\n"), stderr)
	}
	if got, stderr := list("--risk-max", "LOW"); got != string(block[1]) {
		t.Errorf("README.md's tools list --risk-max LOW:\n%s\ncapgate prints:\n%s\nstderr:\n%s", block[1], got, stderr)
	}
}

// linkOrCopy makes dst the file src: a hard link, or a copy across
// filesystems.
func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}
