package pidlock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestHelperHold is not a test: run with PIDLOCK_HOLD=path it takes the
// lock, says so and waits for stdin to close.
func TestHelperHold(t *testing.T) {
	path := os.Getenv("PIDLOCK_HOLD")
	if path == "" {
		t.Skip("a helper process")
	}
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("held\n")
	var b [1]byte
	os.Stdin.Read(b[:])
	l.Release()
}

// TestAcquire: another process holds the lock, so Acquire is refused with
// its pid and the file stays; once it is released the lock is ours, with
// our pid in the file, and Release removes it.
func TestAcquire(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.pid")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHold$")
	cmd.Env = append(os.Environ(), "PIDLOCK_HOLD="+path)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("the helper did not take the lock: %q %v", buf, err)
	}
	_, err = Acquire(path)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("Acquire while another holds it: %v, want ErrHeld naming pid %d", err, cmd.Process.Pid)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("the file holds %q, want our pid", b)
	}
	l.Release()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Release left the file: %v", err)
	}
}
