//go:build linux

package proc

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

var dumpableMu sync.Mutex

// Start starts cmd. The OS thread is locked around the fork, since the
// parent-death signal a launcher asks for is tied to the thread that
// forks (golang/go#27505). capgate keeps itself non-dumpable (HardenSelf)
// so that no process of its user reads its /proc files; a child in a new
// user namespace, whose id maps capgate writes after the fork, needs the
// fork to happen dumpable (/proc/<child> is root's otherwise), so capgate
// is dumpable for that fork alone.
func Start(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if a := cmd.SysProcAttr; a == nil || a.Cloneflags&syscall.CLONE_NEWUSER == 0 {
		return cmd.Start()
	}
	dumpableMu.Lock()
	defer dumpableMu.Unlock()
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return cmd.Start()
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		return cmd.Start()
	}
	defer unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	return cmd.Start()
}

// HardenSelf makes capgate non-dumpable: no other process of its user can
// read its memory or /proc/<pid>/environ (where its secrets may be), nor
// ptrace it, and it leaves no core dump.
func HardenSelf() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }

// MemFile is b in an anonymous memory file called name, at offset 0: for
// a child to read whole (a tool's input, the sandbox trampoline's plan),
// whatever its size, never in an environment or on disk.
func MemFile(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
