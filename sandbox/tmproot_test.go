//go:build linux

package sandbox

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// held is a capgate stand-in (the test binary as launcher) whose tool has
// written into its private temp dir and blocks.
type held struct {
	cmd  *exec.Cmd
	tmp  string        // the tool's TMPDIR
	done chan struct{} // closed when every holder of its stdout (the tool) is gone
}

// startHeld starts the launcher (as launcherCred, nil: as the test) with
// tmp as its TMPDIR, and its tool (as toolCred), and waits until the tool
// has written.
func startHeld(t *testing.T, tramp, tmp string, launcherCred, toolCred *syscall.Credential, script string) *held {
	t.Helper()
	spec := Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: "/", Env: []string{"PATH=/usr/bin:/bin"},
		Credential: toolCred, Trampoline: tramp}
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tramp)
	cmd.Env = []string{launchAsEnv + "=" + string(js), "TMPDIR=" + tmp}
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	if launcherCred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: launcherCred}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	h := &held{cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		defer close(h.done)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	select {
	case h.tmp = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatal("the tool never reported its temp dir")
	}
	if !strings.HasPrefix(h.tmp, "/") {
		t.Fatalf("the tool's TMPDIR: %q", h.tmp)
	}
	return h
}

// kill SIGKILLs the launcher, as an OOM or a crash would, and waits for
// the kernel to end its tool (the parent-death signal).
func (h *held) kill(t *testing.T) {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	testkit.WaitFor(t, 30*time.Second, "the killed launcher's tool to end", func() bool {
		select {
		case <-h.done:
			return true
		default:
			return false
		}
	})
}

const writeAndBlock = `echo killed-tool-data > "$TMPDIR/left" && echo "$TMPDIR" && exec sleep 600`

// checkKilledLeavesNothing: capgate A and B each run a tool that wrote
// into its temp dir; A is SIGKILLed. The next capgate to start removes
// A's temp dir, the tool's file with it, and leaves live B's alone.
//
// Their run dirs go in a temp dir of the test's own: every capgate that
// starts sweeps the dead ones' in its TMPDIR, and other packages' tests
// start capgates all the while, which swept A's before the control check.
func checkKilledLeavesNothing(t *testing.T, tramp string, launcherCred, toolCred *syscall.Credential) {
	tmp, err := os.MkdirTemp("", "capgate-kill-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o1777); err != nil { // a launcher as nobody makes its run dir here
		t.Fatal(err)
	}
	a := startHeld(t, tramp, tmp, launcherCred, toolCred, writeAndBlock)
	b := startHeld(t, tramp, tmp, launcherCred, toolCred, writeAndBlock)
	if !strings.HasPrefix(a.tmp, tmp+"/") {
		t.Fatalf("the launcher's run dir %s is not in its TMPDIR %s", a.tmp, tmp)
	}
	a.kill(t)
	if _, err := os.Stat(filepath.Join(a.tmp, "left")); err != nil {
		t.Fatalf("control: the killed tool's file should still be there before the next start: %v", err)
	}
	// The next capgate starts and launches a tool.
	next := startHeld(t, tramp, tmp, launcherCred, toolCred, `echo "$TMPDIR"; exec sleep 600`)
	if _, err := os.Lstat(a.tmp); !os.IsNotExist(err) {
		t.Errorf("the killed capgate's tool temp dir %s survived the next start (%v)", a.tmp, err)
	}
	if _, err := os.Lstat(filepath.Dir(a.tmp)); !os.IsNotExist(err) {
		t.Errorf("the killed capgate's run dir %s survived the next start (%v)", filepath.Dir(a.tmp), err)
	}
	if got, err := os.ReadFile(filepath.Join(b.tmp, "left")); err != nil || string(got) != "killed-tool-data\n" {
		t.Errorf("the live capgate's tool temp dir was touched: %q, %v", got, err)
	}
	if _, err := os.Stat(next.tmp); err != nil {
		t.Errorf("the new capgate's own tool temp dir: %v", err)
	}
	b.kill(t)
	next.kill(t)
	os.RemoveAll(filepath.Dir(b.tmp))
	os.RemoveAll(filepath.Dir(next.tmp))
}

// TestKilledCapgateLeavesNoTempDir: as root, its tools as root and as nobody.
func TestKilledCapgateLeavesNoTempDir(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("tool-as-capgate", func(t *testing.T) { checkKilledLeavesNothing(t, self, nil, nil) })
	t.Run("tool-as-nobody", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to switch to nobody")
		}
		_, tramp := nobodyWorld(t, Probe())
		checkKilledLeavesNothing(t, tramp, nil, nobody)
	})
	// capgate itself as nobody: its run dirs are nobody's, swept by the
	// next capgate of the same user.
	t.Run("unprivileged-capgate", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to start capgate as nobody")
		}
		_, tramp := nobodyWorld(t, Probe())
		checkKilledLeavesNothing(t, tramp, nobody, nil)
	})
}

// TestSweepSparesOthers: a run dir another user owns, or one a live
// process holds, stays; a symlink named like one is not followed.
func TestSweepSparesOthers(t *testing.T) {
	if err := PrepareTemp(); err != nil {
		t.Fatal(err)
	}
	own, err := tempRoot()
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	os.WriteFile(filepath.Join(target, "keep"), []byte("x"), 0o644)
	link := filepath.Join(os.TempDir(), runPrefix+"symlink-test")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
	SweepTemp()
	if _, err := os.Stat(own); err != nil {
		t.Errorf("the sweep removed this live process's own run dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "keep")); err != nil {
		t.Errorf("the sweep followed a symlink: %v", err)
	}
}

// TestReleaseTemp: a capgate that ends removes its dir when empty, and a
// launch after that (serve run again in one process) gets a new one.
func TestReleaseTemp(t *testing.T) {
	first, err := tempRoot()
	if err != nil {
		t.Fatal(err)
	}
	ReleaseTemp()
	if _, err := os.Lstat(first); !os.IsNotExist(err) {
		t.Fatalf("ReleaseTemp left %s (%v)", first, err)
	}
	second, err := tempRoot()
	if err != nil || second == first {
		t.Fatalf("after ReleaseTemp: %q, %v", second, err)
	}
	if _, err := os.Stat(second); err != nil {
		t.Fatal(err)
	}
}
