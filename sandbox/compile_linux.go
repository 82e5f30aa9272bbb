//go:build linux

package sandbox

import (
	"fmt"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/capgate/capgate/sandbox/trampoline"
)

// The launcher works out what the trampoline loads, so that the
// trampoline imports neither go-landlock nor go-seccomp-bpf (whose inits
// would come before its own, see package trampoline): Landlock's ruleset
// for this kernel, and the seccomp filter as BPF.

// compile fills in the plan's ruleset and filter from its decisions.
func (p *plan) compile() error {
	if p.Landlock {
		p.HandledFS, p.HandledNet, p.Scoped, p.RestrictFlags = rulesetFor(landlockABI(), p.NoTCP, p.AuditTag != "")
	}
	if p.NoSocket || p.NoUnix || p.NoFork {
		f, err := cachedFilter(filterKey{p.NoSocket, p.NoUnix, p.NoFork, p.Notify})
		if err != nil {
			return fmt.Errorf("sandbox: seccomp filter: %w", err)
		}
		p.Filter = f
	}
	return nil
}

// landlockABI is the ABI go-landlock would use here: the kernel's, but 5
// where signal scoping (ABI 6) has its bug unfixed (erratum 2), as
// go-landlock's own detection has it.
var landlockABI = sync.OnceValue(func() int {
	v, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	if v >= 6 {
		if errata, err := llsys.LandlockGetErrata(); err != nil || errata&0x2 == 0 {
			v = 5
		}
	}
	return v
})

// abiConfigs are go-landlock's presets, by ABI.
var abiConfigs = []landlock.Config{{}, landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5, landlock.V6,
	landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11}

// rulesetFor is what go-landlock's V7.BestEffort() restricts on a kernel
// of Landlock ABI abi (with TCP's rights only under noTCP, and the tool's
// denials logged after its exec where the ABI can): V7's rights, less what
// the ABI lacks.
func rulesetFor(abi int, noTCP, logExec bool) (fs, net, scoped uint64, flags uint32) {
	have := abiConfigs[min(max(abi, 0), len(abiConfigs)-1)]
	fs = uint64(landlock.V7.HandledAccessFS & have.HandledAccessFS)
	if noTCP {
		net = uint64(landlock.V7.HandledAccessNet & have.HandledAccessNet)
	}
	scoped = uint64(landlock.V7.Scoped & have.Scoped)
	if logExec && abi >= 7 {
		flags = llsys.FlagRestrictSelfLogNewExecOn
	}
	return fs, net, scoped, flags
}

// filterKey is what a filter depends on: seccompFilter's arguments.
type filterKey struct{ noSocket, noUnix, noFork, notify bool }

var (
	filtersMu sync.Mutex
	filters   = map[filterKey][]uint64{}
)

// cachedFilter is seccompFilter, assembled once per kind (~0.1 ms each):
// an extension command starts on every call. The plans share it, read only.
func cachedFilter(k filterKey) ([]uint64, error) {
	filtersMu.Lock()
	defer filtersMu.Unlock()
	if f, ok := filters[k]; ok {
		return f, nil
	}
	f, err := seccompFilter(k.noSocket, k.noUnix, k.noFork, k.notify)
	if err == nil {
		filters[k] = f
	}
	return f, err
}

const errnoRet = uint32(seccomp.ActionErrno)

// seccompFilter refuses sockets of every family (no_network's fallback),
// or with a network namespace those of every family it does not isolate
// (noUnix: all but AF_INET, AF_INET6 and AF_NETLINK, so AF_UNIX and
// AF_VSOCK reach nothing outside), and new processes (no_subprocess):
// fork, vfork and clone without CLONE_THREAD get EPERM; clone3, whose
// flags sit in memory a filter cannot read, gets ENOSYS so libc falls
// back to clone. io_uring, which can open sockets and bypass the filter,
// is refused too. A syscall of another ABI (i386 int 0x80) gets ENOSYS
// before anything else: the policy's program lets a foreign architecture
// through (x32 it refuses itself). One filter, where there were two (the
// guard, then the policy): seccomp runs every filter on every syscall and
// keeps the strictest answer, so the guard first in the same program
// answers each syscall as the pair did.
//
// With notify, socket() and the new processes go to capgate instead
// (seccomp user notification, see notify_linux.go), which answers EPERM
// and records each.
func seccompFilter(noSocket, noUnix, noFork, notify bool) ([]uint64, error) {
	insts, err := seccompPolicy(noSocket, noUnix, noFork, notify)
	if err != nil {
		return nil, err
	}
	guard, err := archGuard()
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(append(guard, insts...))
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(raw))
	for i, r := range raw {
		out[i] = trampoline.Insn(r.Op, r.Jt, r.Jf, r.K)
	}
	return out, nil
}

// seccompPolicy is seccompFilter's program but for the guard.
func seccompPolicy(noSocket, noUnix, noFork, notify bool) ([]bpf.Instruction, error) {
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
			seccomp.SyscallGroup{Action: forks, Names: forkSyscalls(),
				NamesWithCondtions: []seccomp.NameWithConditions{{Name: "clone", Conditions: seccomp.ArgumentConditions{
					{Argument: 0, Operation: seccomp.BitsNotSet, Value: unix.CLONE_THREAD}}}}},
			seccomp.SyscallGroup{Action: enosys, Names: []string{"clone3"}})
	}
	groups = append(groups, seccomp.SyscallGroup{Action: eperm, Names: []string{"io_uring_setup"}})
	policy := seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
	return policy.Assemble()
}

// forkSyscalls are fork and vfork where this architecture has them:
// arm64 (like riscv64 and loong64) has only clone and clone3, and
// go-seccomp-bpf refuses a policy naming a syscall its table lacks.
func forkSyscalls() []string {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil // archGuard fails the filter on the same error
	}
	var names []string
	for _, n := range []string{"fork", "vfork"} {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// archGuard answers ENOSYS to a syscall of an ABI other than this
// binary's, and goes on to the next instruction for its own.
func archGuard() ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: errnoRet | uint32(unix.ENOSYS)},
	}, nil
}
