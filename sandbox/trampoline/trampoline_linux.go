//go:build linux

package trampoline

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

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
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`

	Landlock   bool     `json:"landlock"`
	ReadDirs   []string `json:"read_dirs"`
	ReadFiles  []string `json:"read_files"`
	WriteDirs  []string `json:"write_dirs"`
	WriteFiles []string `json:"write_files"`
	NoTCP      bool     `json:"no_tcp"` // Landlock denies TCP bind and connect

	NoSocket bool `json:"no_socket"` // seccomp refuses socket() but AF_UNIX
	NoFork   bool `json:"no_fork"`   // seccomp refuses new processes
	// NoUnix refuses socket() of every family a network namespace does
	// not isolate (AF_UNIX, AF_VSOCK, ...): no_network with a namespace.
	NoUnix bool `json:"no_unix"`
	// Notify hands both to capgate (fd 4), which refuses and records them.
	Notify bool `json:"notify"`

	// The baseline, for every tool: the user to switch to (after dropping
	// every capability, the bounding set included), and capgate's pidfd
	// (fd 3, -1: none), checked once the parent-death signal is set again.
	SetUser bool `json:"set_user"`
	UID     int  `json:"uid"`
	GID     int  `json:"gid"`
	Alive   int  `json:"alive"`
	// AuditTag is the comm the trampoline takes before it confines itself,
	// with Landlock's logging of the tool's denials on: capgate finds the
	// launch's denials by it in the audit records ("": no logging).
	AuditTag string `json:"audit_tag,omitempty"`
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
	var p Plan
	if err := json.Unmarshal(js, &p); err != nil {
		fail(fmt.Errorf("reading the plan: %w", err))
	}
	fail(p.apply())
}

// init runs the trampoline as soon as this package is initialised, which
// is early: its imports are few (no capgate package but nsinit), so Go,
// which initialises packages in import-path order as their imports are
// ready, runs it after about 100 of capgate's package inits, not the ~160
// before sandbox's (regexp, tool, harden, yaml...). Every confined tool's
// start pays for those.
func init() { Main() }

func fail(err error) {
	fmt.Fprintf(os.Stderr, "%s%v\n", nsinit.FailPrefix, err)
	os.Exit(nsinit.StartFailure)
}

// apply confines this process as planned and execs the tool. seccomp
// filters, capabilities and no_new_privs bind the calling thread, so the
// thread is locked and execs itself; Landlock and the user switch bind
// every thread. The order matters: the bounding set can only be dropped
// while capgate's capabilities remain, and Landlock's rules are opened
// before the switch to run_as can hide their paths.
func (p Plan) apply() error {
	runtime.LockOSThread()
	if err := dropBounding(); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if p.Landlock {
		cfg := landlock.V7.BestEffort()
		if !p.NoTCP {
			cfg.HandledAccessNet = 0
		}
		// The paths were listed before exec (carving around deny paths
		// lists whole directories); one removed since grants nothing, so
		// it is skipped, not fatal.
		rules := []landlock.Rule{}
		if len(p.ReadDirs) > 0 {
			rules = append(rules, landlock.RODirs(p.ReadDirs...).IgnoreIfMissing())
		}
		if len(p.ReadFiles) > 0 {
			rules = append(rules, landlock.ROFiles(p.ReadFiles...).IgnoreIfMissing())
		}
		if len(p.WriteDirs) > 0 {
			rules = append(rules, landlock.RWDirs(p.WriteDirs...).IgnoreIfMissing())
		}
		if len(p.WriteFiles) > 0 {
			rules = append(rules, landlock.RWFiles(p.WriteFiles...).IgnoreIfMissing())
		}
		if p.AuditTag != "" {
			// Landlock records the comm of the domain's maker: the tag
			// ties the tool's denials to this launch (audit_linux.go).
			if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&append([]byte(p.AuditTag), 0)[0])), 0, 0, 0); err != nil {
				return fmt.Errorf("audit tag: %w", err)
			}
			cfg = cfg.EnableLoggingForSubprocesses()
		}
		if err := cfg.Restrict(rules...); err != nil {
			return fmt.Errorf("landlock: %w", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
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
	if p.NoSocket || p.NoUnix || p.NoFork {
		if err := loadSeccomp(p.NoSocket, p.NoUnix, p.NoFork, p.Notify); err != nil {
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
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
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
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
				return fmt.Errorf("descriptor %d: %w", fd, err)
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
	if wd == "" || !path.IsAbs(p.Path) || !under(path.Clean(p.Path), wd) {
		return p.Path
	}
	// filepath.Rel, for a path under wd (path/filepath would init late).
	rel := strings.TrimPrefix(strings.TrimPrefix(path.Clean(p.Path), wd), "/")
	if rel == "" {
		rel = "."
	}
	return "./" + rel
}

// under reports whether p is d or inside it (sandbox's under).
func under(p, d string) bool {
	return p == d || d == "/" || strings.HasPrefix(p, d+"/")
}

// as names the user a path was refused to, when the tool is not
// capgate's own: a pack under a 0700 dir is unreadable by run_as.
func (p Plan) as() string {
	if !p.SetUser {
		return ""
	}
	return fmt.Sprintf(" as run_as %d:%d", p.UID, p.GID)
}

const errnoRet = uint32(seccomp.ActionErrno)

// loadSeccomp refuses sockets of every family (no_network's fallback),
// or with a network namespace those of every family it does not isolate
// (noUnix: all but AF_INET, AF_INET6 and AF_NETLINK, so AF_UNIX and
// AF_VSOCK reach nothing outside), and new processes (no_subprocess):
// fork, vfork and clone
// without CLONE_THREAD get EPERM; clone3, whose flags sit in memory a filter
// cannot read, gets ENOSYS so libc falls back to clone. io_uring, which can
// open sockets and bypass the filter, is refused too. A syscall of another
// ABI (i386 int 0x80, x32) is refused by a second filter, since the first
// lets a foreign architecture through.
//
// With notify, socket() and the new processes go to capgate instead
// (seccomp user notification, see notify_linux.go), which answers EPERM
// and records each.
func loadSeccomp(noSocket, noUnix, noFork, notify bool) error {
	eperm := seccomp.Action(errnoRet | uint32(unix.EPERM))
	enosys := seccomp.Action(errnoRet | uint32(unix.ENOSYS))
	sockets, forks := seccomp.Action(errnoRet|uint32(unix.EAFNOSUPPORT)), eperm
	if notify {
		sockets, forks = seccomp.ActionUserNotify, seccomp.ActionUserNotify
	}
	var groups []seccomp.SyscallGroup
	switch {
	case noSocket:
		groups = append(groups, seccomp.SyscallGroup{Action: sockets, Names: []string{"socket"}})
	case noUnix:
		groups = append(groups, seccomp.SyscallGroup{
			Action: sockets,
			NamesWithCondtions: []seccomp.NameWithConditions{{Name: "socket", Conditions: seccomp.ArgumentConditions{
				{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_INET},
				{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_INET6},
				{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_NETLINK}}}},
		})
	}
	if noFork {
		groups = append(groups,
			seccomp.SyscallGroup{Action: forks, Names: []string{"fork", "vfork"},
				NamesWithCondtions: []seccomp.NameWithConditions{{Name: "clone", Conditions: seccomp.ArgumentConditions{
					{Argument: 0, Operation: seccomp.BitsNotSet, Value: unix.CLONE_THREAD}}}}},
			seccomp.SyscallGroup{Action: enosys, Names: []string{"clone3"}})
	}
	groups = append(groups, seccomp.SyscallGroup{Action: eperm, Names: []string{"io_uring_setup"}})
	policy := seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
	if err := loadPolicy(policy, notify); err != nil {
		return err
	}
	return loadArchGuard()
}

// loadPolicy loads policy's filter: with notify, through a listener handed
// to capgate (sendListener), else as it is.
func loadPolicy(policy seccomp.Policy, notify bool) error {
	if !notify {
		return seccomp.LoadFilter(seccomp.Filter{NoNewPrivs: true, Policy: policy})
	}
	insts, err := policy.Assemble()
	if err != nil {
		return err
	}
	prog, err := sockFprog(insts)
	if err != nil {
		return err
	}
	return sendListener(prog)
}

// loadArchGuard refuses every syscall made through an ABI other than this
// binary's own, with ENOSYS.
func loadArchGuard() error {
	info, err := arch.GetInfo("")
	if err != nil {
		return err
	}
	insts := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: errnoRet | uint32(unix.ENOSYS)},
		bpf.RetConstant{Val: uint32(seccomp.ActionAllow)},
	}
	prog, err := sockFprog(insts)
	if err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(prog))); e != 0 {
		return fmt.Errorf("arch guard: %w", e)
	}
	return nil
}

// sockFprog assembles a BPF program for seccomp(2).
func sockFprog(insts []bpf.Instruction) (*unix.SockFprog, error) {
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}, nil
}
