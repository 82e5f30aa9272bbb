package audit

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// tmpfs mounts a tmpfs of size bytes for the test, or skips the test when
// this process may not mount (CI runs as root, so it runs there).
func tmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("needs to mount a small tmpfs to fill it up (run as root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes path until the filesystem is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestDiskFull fills the filesystem under a real Log: the log turns
// unhealthy at its next group commit, says so once, still lands the
// records logged meanwhile (they go to the space reserved ahead), and
// recovers, once, when space comes back.
func TestDiskFull(t *testing.T) {
	dir := tmpfs(t, "1m")
	path := filepath.Join(dir, "audit.jsonl")
	var mu sync.Mutex
	var changes []error
	l := openT(t, path, Options{FlushInterval: 5 * time.Millisecond, Reserve: 64 << 10, OnHealth: func(err error) {
		mu.Lock()
		changes = append(changes, err)
		mu.Unlock()
	}})
	defer l.Close()
	logged := 0
	log := func(n int) {
		for range n {
			logged++
			l.Log(fullEvent(TypeToolCall, logged))
		}
	}
	log(10)
	if err := l.Flush(); err != nil || l.Healthy() != nil {
		t.Fatalf("before the disk fills: %v %v", err, l.Healthy())
	}
	fill(t, filepath.Join(dir, "filler"))
	// Calls let through before the next group commit: their records land.
	log(20)
	l.Flush()
	if err := l.Healthy(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("with the disk full: Healthy() = %v, want ENOSPC", err)
	}
	// Refusals while unhealthy are counted, not queued.
	l.Log(Event{Type: TypeToolCall, Decision: "error", Gate: GateAudit, Code: "capability_backend_unavailable"})
	if l.Unrecorded() != 1 {
		t.Errorf("Unrecorded() = %d", l.Unrecorded())
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != logged {
		t.Errorf("with the disk full: %+v %v, want %d lines", rep, err, logged)
	}
	// The writer retries meanwhile: each failed round stores its error anew.
	failed := l.sick.Load()
	testkit.WaitFor(t, 5*time.Second, "the writer to retry on the full disk", func() bool {
		p := l.sick.Load()
		return p != nil && p != failed
	})
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(5*time.Second, func() bool { return l.Healthy() == nil })
	if err := l.Healthy(); err != nil {
		t.Fatalf("space came back, still unhealthy: %v", err)
	}
	// The writer's failures meanwhile are reported by the next Flush.
	if err := l.Flush(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	log(5)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != logged || l.Dropped() != 0 {
		t.Errorf("after: %+v %v, want %d lines, none dropped (%d)", rep, err, logged, l.Dropped())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || !errors.Is(changes[0], syscall.ENOSPC) || changes[1] != nil {
		t.Errorf("OnHealth calls: %v, want [ENOSPC, nil]", changes)
	}
}
