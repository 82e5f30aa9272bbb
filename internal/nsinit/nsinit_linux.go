//go:build linux

package nsinit

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"unsafe"
)

// aliveFD, notifyFD and planFD are where the trampoline finds capgate's
// pidfd, the seccomp notifier's socket and its plan (sandbox: the same
// numbers).
const (
	aliveFD  = 3
	notifyFD = 4
	planFD   = 5
)

// Value is Env's value for the launcher.
func Value(alive int, notify bool) string {
	n := "0"
	if notify {
		n = "1"
	}
	return strconv.Itoa(alive) + "," + n
}

func init() {
	v, ok := os.LookupEnv(Env)
	if !ok {
		return
	}
	alive, notify, err := parse(v)
	if err != nil {
		fail(err)
	}
	reap(alive, notify)
}

func parse(v string) (alive int, notify bool, err error) {
	// By hand, not strings.Cut (see hasPrefix): "ALIVE,0" or "ALIVE,1".
	ok := len(v) >= 3 && v[len(v)-2] == ','
	a, n := "", ""
	if ok {
		a, n = v[:len(v)-2], v[len(v)-1:]
	}
	alive, aerr := strconv.Atoi(a)
	if !ok || aerr != nil || (n != "0" && n != "1") {
		return 0, false, errors.New("the tool's init: malformed " + Env + " " + strconv.Quote(v))
	}
	return alive, n == "1", nil
}

// hasPrefix is strings.HasPrefix. This package (and the trampoline, which
// imports it) does without package strings: Go initialises a package only
// once every package it imports is, and strings's turn, in capgate's
// import-path order, comes after ~120 others (see sandbox/trampoline).
func hasPrefix(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }

func fail(err error) {
	os.Stderr.WriteString(FailPrefix + err.Error() + "\n")
	os.Exit(StartFailure)
}

// reap starts the trampoline on the same stdio and descriptors, reaps
// every process the namespace orphans, and exits as the trampoline (then
// the tool) did once it ends, which ends the namespace. It never returns.
func reap(alive int, notify bool) {
	if os.Getpid() != 1 {
		fail(errors.New("the tool's init is not PID 1 of a namespace"))
	}
	// A signal a process of the namespace sends init must not end the
	// namespace early; from outside only SIGKILL reaches it anyway.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGPIPE,
		syscall.SIGUSR1, syscall.SIGUSR2)
	// Go set the parent-death signal before exec; capgate may have died
	// before that (its pidfd says so), and then nothing would signal.
	if alive >= 0 && readable(alive) {
		fail(errors.New("capgate exited before the tool started"))
	}
	mountProc()
	self, err := os.Executable()
	if err != nil {
		fail(errors.New("finding the trampoline: " + err.Error()))
	}
	// fd 5 is the trampoline's plan (sandbox reads it from there).
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr, nil, nil, os.NewFile(planFD, "capgate-plan")}
	if alive >= 0 {
		files[aliveFD] = os.NewFile(uintptr(alive), "capgate-pidfd")
	}
	if notify {
		files[notifyFD] = os.NewFile(notifyFD, "seccomp-notify")
	}
	var env []string
	for _, kv := range os.Environ() {
		if !hasPrefix(kv, Env+"=") {
			env = append(env, kv)
		}
	}
	child, err := os.StartProcess(self, os.Args, &os.ProcAttr{Env: env, Files: files,
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}})
	if err != nil {
		fail(errors.New("starting the trampoline: " + err.Error()))
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
			fail(errors.New("waiting for the tool: " + err.Error()))
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

// mountProc mounts, in the namespace's own mount namespace, a /proc of
// its PID namespace over the host's. In the host's, the trampoline's PID
// names another process or none, and go-landlock (with cgo) opens
// /proc/<getpid()>/task: the tool would not start, or would start
// depending on which host PIDs exist. The tool sees its own processes
// only. Where the kernel refuses the mount (a container that masks parts
// of /proc from a user namespace), the host's /proc stays.
//
// An unprivileged capgate's launcher hands init CAP_SYS_ADMIN (in the
// tool's user namespace) for this, ambient; init lowers it here, so the
// trampoline inherits it no further (the trampoline drops every
// capability it has anyway).
func mountProc() {
	defer syscall.RawSyscall(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientLower, capSysAdmin)
	// Private first: the new /proc must not propagate to the host's mounts.
	if syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "") != nil {
		return
	}
	_ = syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
}

// From linux/prctl.h and linux/capability.h (golang.org/x/sys stays out
// of this package's imports).
const (
	prCapAmbient      = 47
	prCapAmbientLower = 3
	capSysAdmin       = 21
)

// readable polls fd once, without waiting (a pidfd is readable once its
// process has exited). The raw ppoll keeps golang.org/x/sys out of this
// package's imports, and so this init early.
func readable(fd int) bool {
	fds := [1]struct {
		fd      int32
		events  int16
		revents int16
	}{{fd: int32(fd), events: 0x1}} // POLLIN
	var ts syscall.Timespec
	n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1,
		uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	return errno == 0 && n > 0
}
