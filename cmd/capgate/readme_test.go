package main

import (
	"os"
	"os/exec"
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

	// As the README's first step does: the quickstart runs its tools as
	// nobody under root, which cannot use go run.
	build := exec.Command("go", "build", "-o", filepath.Join("examples", "quickstart", "bin")+"/",
		"./internal/testkit/mcpfixture", "./internal/testkit/bridgefixture")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the quickstart's fixtures: %v\n%s", err, out)
	}
	bin := testkit.Build(t, capgatePkg)
	list := func(args ...string) string {
		cmd := exec.Command(bin, append([]string{"tools", "list", "--config", "examples/quickstart/capgate.toml"}, args...)...)
		cmd.Dir = root // as the README runs it
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("capgate tools list %v: %v", args, err)
		}
		return string(out)
	}
	all := strings.Split(strings.TrimSpace(list()), "\n")
	if got := len(all) - 1; got != want { // less the header
		t.Errorf("README.md says the quickstart serves %d tools; it serves %d:\n%s", want, got, strings.Join(all, "\n"))
	}
	if got := list("--risk-max", "LOW"); got != string(block[1]) {
		t.Errorf("README.md's tools list --risk-max LOW:\n%s\ncapgate prints:\n%s", block[1], got)
	}
}
