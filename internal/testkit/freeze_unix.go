//go:build unix

package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Freeze stops serve with SIGSTOP (it keeps its sockets, so connections
// are accepted and nothing is answered: a hung replica) and returns once
// it has stopped. See Freeze.
func (s *Served) Freeze(tb testing.TB) {
	tb.Helper()
	Freeze(tb, s.Cmd.Process.Pid)
}

// Freeze sends process pid SIGSTOP and waits until every thread of it
// has stopped. kill returns before that: only the thread the kernel
// picks is woken to begin the stop, and until it runs the others go on,
// which on a loaded machine is long enough to answer a request sent
// after the kill (a Go server answered 16 to 47 of 200 such requests at
// load 7 to 10, and none once this waited).
func Freeze(tb testing.TB, pid int) {
	tb.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		tb.Fatalf("SIGSTOP to pid %d: %v", pid, err)
	}
	WaitFor(tb, 30*time.Second, fmt.Sprintf("pid %d to stop", pid), func() bool {
		stopped, err := processStopped(pid)
		if err != nil {
			tb.Fatalf("is pid %d stopped: %v", pid, err)
		}
		return stopped
	})
}

// processStopped says whether every thread of process pid is stopped:
// on Linux from /proc/PID/task/*/stat, elsewhere from ps.
func processStopped(pid int) (bool, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		out, err := exec.Command("ps", "-o", "stat=", "-p", fmt.Sprint(pid)).Output()
		if err != nil {
			return false, fmt.Errorf("ps: %w", err)
		}
		return strings.HasPrefix(strings.TrimSpace(string(out)), "T"), nil
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue // a thread that ended
		}
		if err != nil {
			return false, err
		}
		// "pid (comm) S ...": the state follows the last ')'.
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 || i+2 >= len(st) {
			return false, fmt.Errorf("%s: no state in %q", f, st)
		}
		if st[i+2] != 'T' && st[i+2] != 't' {
			return false, nil
		}
	}
	return true, nil
}
