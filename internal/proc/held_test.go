package proc_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/internal/testkit"
)

// TestRunOutputHeld: a command that exits leaving a process that holds
// its stdout fails with ErrOutputHeld (its output may be cut short), not
// as a command that could not start, and the process it left is killed.
func TestRunOutputHeld(t *testing.T) {
	_, stderr, err := proc.Run(context.Background(), proc.Spec{
		Argv:    []string{"/bin/sh", "-c", "sleep 60 & echo $! >&2; echo partial"},
		Env:     []string{"PATH=/bin:/usr/bin"},
		Timeout: 30 * time.Second, MaxOutput: 1 << 16,
	})
	if !errors.Is(err, proc.ErrOutputHeld) {
		t.Fatalf("err = %v, want ErrOutputHeld", err)
	}
	var start *proc.StartError
	if errors.As(err, &start) {
		t.Errorf("reported as a start failure: %v", err)
	}
	pid := strings.TrimSpace(stderr)
	if _, perr := strconv.Atoi(pid); perr != nil {
		t.Fatalf("stderr %q: no pid", stderr)
	}
	// Killed with its group (a zombie until it is reaped counts as gone).
	testkit.WaitFor(t, 30*time.Second, "the process it left ("+pid+") to end", func() bool {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})
}
