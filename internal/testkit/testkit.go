// Package testkit holds helpers shared by tests: building the fixture
// programs that tests run as real processes.
package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
	workDir string
)

// Build compiles the main package pkg (an import path of this module, such
// as "github.com/capgate/capgate/internal/testkit/bridgefixture") once per
// test binary and returns the program's path.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	if workDir == "" {
		d, err := os.MkdirTemp("", "capgate-testkit-")
		if err != nil {
			tb.Fatal(err)
		}
		workDir = d
	}
	out := filepath.Join(workDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, strings.TrimSpace(string(b)))
	}
	built[pkg] = out
	return out
}

// Cleanup removes what Build made; call it from TestMain after m.Run.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if workDir != "" {
		os.RemoveAll(workDir)
	}
}
