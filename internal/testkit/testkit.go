// Package testkit holds helpers shared by tests: building the fixture
// programs that tests run as real processes.
package testkit

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
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

// Main runs a package's tests and removes what Build made; use it as
// func TestMain(m *testing.M) { testkit.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// MCPFixture is the upstream MCP server the tests run.
const MCPFixture = "github.com/capgate/capgate/internal/testkit/mcpfixture"

// BridgeFixture is the bridge-v1 provider the tests run.
const BridgeFixture = "github.com/capgate/capgate/internal/testkit/bridgefixture"

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ServeMCPFixture runs the MCP fixture on addr with transport flag "-http"
// or "-sse", waits until it listens, and returns a function that kills it
// (also called at cleanup).
func ServeMCPFixture(tb testing.TB, flag, addr string) (kill func()) {
	tb.Helper()
	cmd := exec.Command(Build(tb, MCPFixture), flag, addr)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	kill = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	tb.Cleanup(kill)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return kill
		}
		if time.Now().After(deadline) {
			kill()
			tb.Fatalf("the MCP fixture did not listen on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
