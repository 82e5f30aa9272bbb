//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Every tool runs in a PID namespace of its own whose first process (its
// init, PID 1 there) is a small reaper: capgate re-executed once more,
// with the parent-death signal. When init dies, however (capgate died and
// the kernel killed it, capgate's timeout killed the group, the tool
// ended), the kernel kills every process left in the namespace: the tool's
// own children too, even those that left its process group or session.
// The trampoline cannot be that init itself: go-landlock's all-threads
// syscalls hang in a PID 1; so init starts it as PID 2.

// reap is init's work: start the trampoline (p without Init) on the same
// stdio and descriptors, reap every process the namespace orphans, and
// exit as the trampoline (then the tool) did once it ends, which ends the
// namespace. It never returns.
func (p plan) reap() {
	if os.Getpid() != 1 {
		fail(errors.New("the tool's init is not PID 1 of a namespace"))
	}
	// A signal a process of the namespace sends init must not end the
	// namespace early; from outside only SIGKILL reaches it anyway.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGPIPE,
		syscall.SIGUSR1, syscall.SIGUSR2)
	// Go set the parent-death signal before exec; capgate may have died
	// before that (its pidfd says so), and then nothing would signal.
	if p.Alive >= 0 {
		fds := []unix.PollFd{{Fd: int32(p.Alive), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			fail(errors.New("capgate exited before the tool started"))
		}
	}
	p.Init = false
	js, err := json.Marshal(p)
	if err != nil {
		fail(fmt.Errorf("encoding the plan: %w", err))
	}
	self, err := os.Executable()
	if err != nil {
		fail(fmt.Errorf("finding the trampoline: %w", err))
	}
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr, nil, nil}
	if p.Alive >= 0 {
		files[aliveFD] = os.NewFile(uintptr(p.Alive), "capgate-pidfd")
	}
	if p.Notify {
		files[notifyFD] = os.NewFile(notifyFD, "seccomp-notify")
	}
	child, err := os.StartProcess(self, []string{"capgate-sandbox", p.Path}, &os.ProcAttr{
		Env: []string{specEnv + "=" + string(js)}, Files: files,
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		fail(fmt.Errorf("starting the trampoline: %w", err))
	}
	// init keeps none of the tool's pipes open: capgate sees their end
	// when the tool's processes close them, not when init exits.
	for _, f := range files[:2] {
		f.Close()
	}
	for _, f := range files[3:] {
		if f != nil {
			f.Close()
		}
	}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			fail(fmt.Errorf("waiting for the tool: %w", err))
		}
		if pid != child.Pid {
			continue // an orphan of the namespace, reaped
		}
		switch {
		case ws.Exited():
			os.Exit(ws.ExitStatus())
		case ws.Signaled():
			os.Exit(128 + int(ws.Signal())) // a PID 1 cannot die of its own signal
		}
	}
}
