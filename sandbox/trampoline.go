//go:build linux

package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Main turns this process into the launcher's trampoline when capgate
// started it as one, and returns at once otherwise. Every binary that
// launches tools through Command calls it first thing in main (and test
// binaries in TestMain). As a trampoline it never returns: it confines
// itself and execs the tool, or exits 126 saying why not.
func Main() {
	v, ok := os.LookupEnv(specEnv)
	if !ok {
		return
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd != planFD {
		fail(fmt.Errorf("reading the plan: %s=%q names no plan descriptor", specEnv, v))
	}
	// Read and closed before anything else: the tool never inherits it.
	f := os.NewFile(uintptr(fd), "capgate-plan")
	js, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		fail(fmt.Errorf("reading the plan: %w", err))
	}
	var p plan
	if err := json.Unmarshal(js, &p); err != nil {
		fail(fmt.Errorf("reading the plan: %w", err))
	}
	fail(p.apply())
}

// init runs the trampoline as soon as this package is initialised, before
// most of capgate's other packages are: some take milliseconds to set up (a
// JSON Schema compiler, 2-4 ms measured with GODEBUG=inittrace=1), which
// every confined tool's start would pay. Main in main stays the entry of
// record; where package order puts this init late, Main catches it there.
func init() { Main() }

func fail(err error) {
	fmt.Fprintf(os.Stderr, "%s%v\n", failPrefix, err)
	os.Exit(startFailure)
}

// apply confines this process as planned and execs the tool. seccomp
// filters, capabilities and no_new_privs bind the calling thread, so the
// thread is locked and execs itself; Landlock and the user switch bind
// every thread. The order matters: the bounding set can only be dropped
// while capgate's capabilities remain, and Landlock's rules are opened
// before the switch to run_as can hide their paths.
func (p plan) apply() error {
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
	if p.NoSocket || p.NoUnix || p.NoFork {
		if err := loadSeccomp(p.NoSocket, p.NoUnix, p.NoFork, p.Notify); err != nil {
			return fmt.Errorf("seccomp: %w", err)
		}
	}
	err := syscall.Exec(p.execPath(wd), p.Argv, p.Env)
	return fmt.Errorf("exec %s%s: %w", p.Path, p.as(), err)
}

// execPath is the program's path for exec: relative to the working
// directory wd when the program is below it, so that run_as needs to
// enter only the directories from there down (the kernel passes this path
// on to a script's interpreter, which opens it from the same directory).
func (p plan) execPath(wd string) string {
	if wd == "" || !filepath.IsAbs(p.Path) || !under(filepath.Clean(p.Path), wd) {
		return p.Path
	}
	rel, err := filepath.Rel(wd, p.Path)
	if err != nil {
		return p.Path
	}
	return "./" + rel
}

// as names the user a path was refused to, when the tool is not
// capgate's own: a pack under a 0700 dir is unreadable by run_as.
func (p plan) as() string {
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
