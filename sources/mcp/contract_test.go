package mcp

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/tool/sourcetest"
)

// fixtureHarness names the fixture's tools the contract uses (big and
// fail come with MCPFIXTURE_BOUNDS and MCPFIXTURE_CONFORMANCE).
func fixtureHarness(s *Source, environ bool) sourcetest.Harness {
	h := sourcetest.Harness{
		Source: s,
		Echo:   "echo",
		EchoInput: func(msg string) json.RawMessage {
			b, _ := json.Marshal(map[string]string{"message": msg})
			return b
		},
		Fail: sourcetest.Case{Tool: "fail"},
		Slow: sourcetest.Case{Tool: "slow", Input: json.RawMessage(`{"delay_ms":5000}`)},
		Big:  sourcetest.Case{Tool: "big", Input: json.RawMessage(`{"bytes":10000}`)},
	}
	if environ {
		h.Environ = sourcetest.Case{Tool: "environ"}
	}
	return h
}

// contractOptions bound the source tightly enough that big is over them.
func contractOptions(o Options) Options {
	o.Name, o.Timeout, o.MaxMessage, o.MinBackoff = "fx", 20*time.Second, 4096, 20*time.Millisecond
	return o
}

func connected(t *testing.T, o Options) *Source {
	t.Helper()
	return connect(t, contractOptions(o))
}

// running reports whether the process whose id (in its PID namespace) is
// in pidFile runs (a zombie does not: it waits only for its parent to reap
// it). Its host pid is found while it runs, and kept.
func running(t *testing.T, pidFile string) func() bool {
	host := 0
	return func() bool {
		if host == 0 {
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatalf("the fixture wrote no pid: %v", err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("pid file: %v", err)
			}
			if host = testkit.HostPID(pid, os.Getpid()); host == 0 {
				return false
			}
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(host) + "/stat")
		return err == nil && !strings.Contains(string(stat), ") Z ")
	}
}

// TestContract runs the fixture upstream, over stdio and streamable HTTP,
// through the contract every source honours.
func TestContract(t *testing.T) {
	t.Run("stdio", func(t *testing.T) {
		bin := testkit.Build(t, fixturePkg)
		sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
			pidFile := filepath.Join(t.TempDir(), "pid")
			s := connected(t, Options{Command: bin, Env: map[string]string{
				"MCPFIXTURE_BOUNDS": "1", "MCPFIXTURE_CONFORMANCE": "1", "FIXTURE_PID_FILE": pidFile,
			}})
			h := fixtureHarness(s, true)
			h.Running = running(t, pidFile)
			return h
		})
	})
	t.Run("streamable-http", func(t *testing.T) {
		sourcetest.Run(t, func(t *testing.T) sourcetest.Harness {
			// The fixture inherits these; capgate does not start it, so its
			// environment is not the source's to check.
			t.Setenv("MCPFIXTURE_BOUNDS", "1")
			t.Setenv("MCPFIXTURE_CONFORMANCE", "1")
			addr := freeAddr(t)
			httpFixture(t, addr)
			return fixtureHarness(connected(t, Options{URL: "http://" + addr + "/mcp"}), false)
		})
	})
}
