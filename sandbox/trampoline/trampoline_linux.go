//go:build linux

package trampoline

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/capgate/capgate/internal/nsinit"
)

// Env marks the trampoline and names the descriptor that holds its plan
// (PlanFD). The plan is not in the environment itself: it lists every
// entry around a deny path (carve), which in a crowded directory such as
// /tmp passes the kernel's 128 KiB limit on one environment string
// (E2BIG), and it holds the tool's secrets.
const Env = "CAPGATE_SANDBOX_SPEC"

// PlanFD is where the trampoline reads its plan (a memfd), AliveFD
// capgate's pidfd, NotifyFD its end of the seccomp notifier's socketpair.
const (
	PlanFD   = 5
	AliveFD  = 3
	NotifyFD = 4
)

// Plan is everything the trampoline applies, decided by the launcher.
type Plan struct {
	Path string
	Argv []string
	Env  []string
	Dir  string

	Landlock bool
	// What the ruleset handles and restrict_self's flags, as go-landlock's
	// V7.BestEffort() has them on this kernel's ABI (the launcher decides).
	HandledFS     uint64
	HandledNet    uint64
	Scoped        uint64
	RestrictFlags uint32
	ReadDirs      []string
	ReadFiles     []string
	WriteDirs     []string
	WriteFiles    []string
	NoTCP         bool // Landlock denies TCP bind and connect

	NoSocket bool // seccomp refuses socket() but AF_UNIX
	NoFork   bool // seccomp refuses new processes
	// NoUnix refuses socket() of every family a network namespace does
	// not isolate (AF_UNIX, AF_VSOCK, ...): no_network with a namespace.
	NoUnix bool
	// Notify hands both to capgate (fd 4), which refuses and records them.
	Notify bool
	// Filter is the seccomp filter that does it, assembled by the launcher
	// (Insn each instruction); empty, none.
	Filter []uint64

	// The baseline, for every tool: the user to switch to (after dropping
	// every capability, the bounding set included), and capgate's pidfd
	// (fd 3, -1: none), checked once the parent-death signal is set again.
	SetUser bool
	UID     int
	GID     int
	Alive   int
	// AuditTag is the comm the trampoline takes before it confines itself,
	// with Landlock's logging of the tool's denials on: capgate finds the
	// launch's denials by it in the audit records ("": no logging).
	AuditTag string
}

// Main turns this process into the launcher's trampoline when capgate
// started it as one, and returns at once otherwise. This package's init
// calls it; sandbox.Main, first thing in main (and in test binaries'
// TestMain), is the entry of record. As a trampoline it never returns: it confines
// itself and execs the tool, or exits 126 saying why not.
func Main() {
	v, ok := os.LookupEnv(Env)
	if !ok {
		return
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd != PlanFD {
		fail(fmt.Errorf("reading the plan: %s=%q names no plan descriptor", Env, v))
	}
	// Read and closed before anything else: the tool never inherits it.
	f := os.NewFile(uintptr(fd), "capgate-plan")
	js, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		fail(fmt.Errorf("reading the plan: %w", err))
	}
	p, err := DecodePlan(js)
	if err != nil {
		fail(fmt.Errorf("reading the plan: %w", err))
	}
	fail(p.apply())
}

// init runs the trampoline as soon as this package is initialised, which
// is early: Go initialises packages in import-path order as their imports
// are ready, and this package imports only the standard library's early
// packages and nsinit, no capgate package, and not golang.org/x/sys/unix,
// go-landlock or go-seccomp-bpf, whose inits (x/sys/unix's sorts after
// every github.com/ and go.* package) would hold it back behind ~95 of
// capgate's package inits. Every confined tool's start pays for those.
func init() { Main() }

func fail(err error) {
	fmt.Fprintf(os.Stderr, "%s%v\n", nsinit.FailPrefix, err)
	os.Exit(nsinit.StartFailure)
}

// apply confines this process as planned and execs the tool. Landlock,
// the seccomp filter, capabilities and no_new_privs bind the calling
// thread, so the thread is locked and execs itself (see restrict for why
// that thread is enough); the user switch binds every thread. The order
// matters: the bounding set can only be dropped
// while capgate's capabilities remain, and Landlock's rules are opened
// before the switch to run_as can hide their paths.
func (p Plan) apply() error {
	runtime.LockOSThread()
	if err := dropBounding(); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if p.Landlock {
		if p.AuditTag != "" {
			// Landlock records the comm of the domain's maker: the tag
			// ties the tool's denials to this launch (audit_linux.go).
			if err := prctl(prSetName, uintptr(unsafe.Pointer(&append([]byte(p.AuditTag), 0)[0]))); err != nil {
				return fmt.Errorf("audit tag: %w", err)
			}
		}
		if err := p.restrict(); err != nil {
			return fmt.Errorf("landlock: %w", err)
		}
	}
	if err := prctl(prSetNoNewPrivs, 1); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// The working directory is entered before the switch to run_as: a pack
	// in a clone under /root (mode 0700) is then usable by nobody, who
	// needs no way through /root to what is below its working directory
	// (the program is run by a path relative to it, see execPath).
	if p.Dir != "" {
		if err := os.Chdir(p.Dir); err != nil {
			return fmt.Errorf("working directory%s: %w", p.as(), err)
		}
	}
	wd, _ := os.Getwd()
	if p.SetUser {
		if err := switchUser(p.UID, p.GID); err != nil {
			return fmt.Errorf("run_as %d:%d: %w", p.UID, p.GID, err)
		}
	}
	if err := dropCaps(); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if err := p.tieToCapgate(); err != nil {
		return err
	}
	if err := closeStray(); err != nil {
		return fmt.Errorf("descriptors: %w", err)
	}
	if (p.NoSocket || p.NoUnix || p.NoFork) && len(p.Filter) == 0 {
		return errors.New("seccomp: the plan refuses syscalls but holds no filter") // a launcher bug: fail closed
	}
	if len(p.Filter) > 0 {
		if err := p.loadFilter(); err != nil {
			return fmt.Errorf("seccomp: %w", err)
		}
	}
	err := syscall.Exec(p.execPath(wd), p.Argv, p.Env)
	return fmt.Errorf("exec %s%s: %w", p.Path, p.as(), err)
}

// closeStray marks every descriptor above stderr close-on-exec, so the
// tool gets its stdio and nothing else. capgate opens its own
// close-on-exec; one it was started with (a supervisor's leak, a shell's
// `exec 7<file`) is not, and a tool reading through it would read what
// Landlock and file modes keep from it: both check at open, not at read.
func closeStray() error {
	_, _, err := syscall.RawSyscall(sysCloseRange, 3, math.MaxUint32, closeRangeCloexec)
	if err == 0 {
		return nil
	}
	// Before Linux 5.11, one by one from /proc; without it, no tool starts.
	if perr := cloexecListed(); perr != nil {
		return fmt.Errorf("close_range: %v; %w", err, perr)
	}
	return nil
}

// cloexecListed is closeStray without close_range.
func cloexecListed() error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing /proc/self/fd: %w", err)
	}
	for _, e := range fds {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			if _, _, e := syscall.RawSyscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFD, syscall.FD_CLOEXEC); e != 0 && e != syscall.EBADF {
				return fmt.Errorf("descriptor %d: %w", fd, e)
			}
		}
	}
	return nil
}

// execPath is the program's path for exec: relative to the working
// directory wd when the program is below it, so that run_as needs to
// enter only the directories from there down (the kernel passes this path
// on to a script's interpreter, which opens it from the same directory).
func (p Plan) execPath(wd string) string {
	clean := path.Clean(p.Path)
	if wd == "" || !path.IsAbs(p.Path) || !under(clean, wd) {
		return p.Path
	}
	// filepath.Rel, for a path under wd (path/filepath would init late).
	rel := clean[len(wd):]
	if len(rel) > 0 && rel[0] == '/' {
		rel = rel[1:]
	}
	if rel == "" {
		rel = "."
	}
	return "./" + rel
}

// under reports whether p is d or inside it (sandbox's under).
func under(p, d string) bool {
	return p == d || d == "/" || len(p) > len(d) && p[:len(d)] == d && p[len(d)] == '/'
}

// as names the user a path was refused to, when the tool is not
// capgate's own: a pack under a 0700 dir is unreadable by run_as.
func (p Plan) as() string {
	if !p.SetUser {
		return ""
	}
	return fmt.Sprintf(" as run_as %d:%d", p.UID, p.GID)
}

// Insn packs one instruction of a classic BPF program for the plan: the
// kernel's struct sock_filter, code | jt<<16 | jf<<24 | k<<32.
func Insn(code uint16, jt, jf uint8, k uint32) uint64 {
	return uint64(code) | uint64(jt)<<16 | uint64(jf)<<24 | uint64(k)<<32
}

// loadFilter loads the plan's seccomp filter on this thread (no TSYNC:
// see restrict for why this thread is enough), under the no_new_privs set
// before: with Notify, through a listener handed to capgate
// (sendListener), else as it is.
func (p Plan) loadFilter() error {
	if len(p.Filter) > math.MaxUint16 {
		return fmt.Errorf("a filter of %d instructions", len(p.Filter))
	}
	filter := make([]syscall.SockFilter, len(p.Filter))
	for i, in := range p.Filter {
		filter[i] = syscall.SockFilter{Code: uint16(in), Jt: uint8(in >> 16), Jf: uint8(in >> 24), K: uint32(in >> 32)}
	}
	prog := &syscall.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if p.Notify {
		return sendListener(prog)
	}
	if _, _, e := syscall.Syscall(sysSeccomp, seccompSetModeFilter, 0, uintptr(unsafe.Pointer(prog))); e != 0 {
		return fmt.Errorf("loading the filter: %w", e)
	}
	return nil
}
