//go:build linux

package sandbox

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestRulesetFor: what the trampoline's Landlock ruleset handles, by ABI,
// is what go-landlock's V7.BestEffort() restricted there (the kernel's
// documented rights per ABI, capped at V7's).
func TestRulesetFor(t *testing.T) {
	const logExec = llsys.FlagRestrictSelfLogNewExecOn
	for _, c := range []struct {
		abi             int
		noTCP, log      bool
		fs, net, scoped uint64
		flags           uint32
	}{
		{1, true, true, 1<<13 - 1, 0, 0, 0},
		{2, false, false, 1<<14 - 1, 0, 0, 0},
		{3, true, false, 1<<15 - 1, 0, 0, 0},
		{4, true, false, 1<<15 - 1, 3, 0, 0},
		{4, false, false, 1<<15 - 1, 0, 0, 0},
		{5, true, true, 1<<16 - 1, 3, 0, 0},
		{6, true, true, 1<<16 - 1, 3, 3, 0},
		{7, true, true, 1<<16 - 1, 3, 3, logExec},
		{7, false, false, 1<<16 - 1, 0, 3, 0},
		// Later ABIs add rights V7 does not ask for (resolve_unix, UDP).
		{11, true, true, 1<<16 - 1, 3, 3, logExec},
		{42, true, true, 1<<16 - 1, 3, 3, logExec},
	} {
		fs, net, scoped, flags := rulesetFor(c.abi, c.noTCP, c.log)
		if fs != c.fs || net != c.net || scoped != c.scoped || flags != c.flags {
			t.Errorf("ABI %d, noTCP %v, log %v: fs %#x net %#x scoped %#x flags %#x; want %#x %#x %#x %#x",
				c.abi, c.noTCP, c.log, fs, net, scoped, flags, c.fs, c.net, c.scoped, c.flags)
		}
	}
	if uint64(landlock.V7.HandledAccessFS) != 1<<16-1 {
		t.Errorf("go-landlock's V7 handles %v: the table above is out of date", landlock.V7.HandledAccessFS)
	}
}

// TestMergedFilterAnswersAsThePair: the trampoline's one seccomp filter
// (the ABI guard, then the policy) answers every syscall as the two
// filters it replaces did, the policy loaded first and the guard second,
// which the kernel ran both of and kept the strictest answer of. Each
// program runs in x/net/bpf's VM on a struct seccomp_data.
func TestMergedFilterAnswersAsThePair(t *testing.T) {
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	nr := func(name string) uint32 {
		n, ok := info.SyscallNames[name]
		if !ok {
			return 0xffff // not on this architecture: any number it lacks
		}
		return uint32(n)
	}
	type call struct {
		arch, nr uint32
		arg0     uint64
	}
	calls := []call{
		{uint32(info.ID), nr("getpid"), 0},
		{uint32(info.ID), nr("read"), 0},
		{uint32(info.ID), nr("socket"), unix.AF_UNIX},
		{uint32(info.ID), nr("socket"), unix.AF_INET},
		{uint32(info.ID), nr("socket"), unix.AF_INET6},
		{uint32(info.ID), nr("socket"), unix.AF_NETLINK},
		{uint32(info.ID), nr("socket"), unix.AF_VSOCK},
		{uint32(info.ID), nr("clone"), unix.CLONE_THREAD | unix.CLONE_VM},
		{uint32(info.ID), nr("clone"), uint64(unix.SIGCHLD)},
		{uint32(info.ID), nr("clone3"), 0},
		{uint32(info.ID), nr("fork"), 0},
		{uint32(info.ID), nr("vfork"), 0},
		{uint32(info.ID), nr("io_uring_setup"), 0},
		{uint32(info.ID), 0x40000000 | nr("socket"), unix.AF_UNIX}, // x32's numbering on amd64
		{uint32(arch.I386.ID), 102, 0},                             // i386 socketcall
		{uint32(arch.I386.ID), 20, 0},                              // i386 getpid
		{uint32(arch.ARM.ID), 281, unix.AF_UNIX},
	}
	run := func(t *testing.T, prog []bpf.Instruction, c call) uint32 {
		t.Helper()
		vm, err := bpf.NewVM(prog)
		if err != nil {
			t.Fatal(err)
		}
		// struct seccomp_data, each 32-bit word as the VM reads it (big
		// endian), a 64-bit argument's low word first (little endian).
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[0:], c.nr)
		binary.BigEndian.PutUint32(data[4:], c.arch)
		binary.BigEndian.PutUint32(data[16:], uint32(c.arg0))
		binary.BigEndian.PutUint32(data[20:], uint32(c.arg0>>32))
		r, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(r)
	}
	// The kernel keeps the answer whose action is lowest as a signed
	// number; on a tie, that of the filter run first, the last loaded.
	strictest := func(first, second uint32) uint32 {
		if int32(second&0xffff0000) < int32(first&0xffff0000) {
			return second
		}
		return first
	}
	guard, err := archGuard()
	if err != nil {
		t.Fatal(err)
	}
	guard = append(guard, bpf.RetConstant{Val: uint32(0x7fff0000)}) // alone, it allowed its own ABI
	enosys := errnoRet | uint32(unix.ENOSYS)
	for _, o := range []struct{ noSocket, noUnix, noFork, notify bool }{
		{true, false, false, false}, {false, true, false, false}, {false, false, true, false},
		{true, false, true, false}, {false, true, true, false}, {true, false, true, true}, {false, true, true, true},
	} {
		t.Run(fmt.Sprintf("%+v", o), func(t *testing.T) {
			policy, err := seccompPolicy(o.noSocket, o.noUnix, o.noFork, o.notify)
			if err != nil {
				t.Fatal(err)
			}
			packed, err := seccompFilter(o.noSocket, o.noUnix, o.noFork, o.notify)
			if err != nil {
				t.Fatal(err)
			}
			merged := make([]bpf.RawInstruction, len(packed))
			for i, in := range packed {
				merged[i] = bpf.RawInstruction{Op: uint16(in), Jt: uint8(in >> 16), Jf: uint8(in >> 24), K: uint32(in >> 32)}
			}
			prog, ok := bpf.Disassemble(merged)
			if !ok {
				t.Fatal("the merged filter does not disassemble")
			}
			for _, c := range calls {
				pair := strictest(run(t, guard, c), run(t, policy, c))
				one := run(t, prog, c)
				if one != pair {
					t.Errorf("%+v: the merged filter answers %#x, the pair %#x", c, one, pair)
				}
				if c.arch != uint32(info.ID) && one != enosys {
					t.Errorf("%+v: a foreign ABI's syscall answered %#x, not ENOSYS", c, one)
				}
			}
		})
	}
}

// BenchmarkSeccompFilter is what assembling a launch's filter costs capgate.
func BenchmarkSeccompFilter(b *testing.B) {
	for b.Loop() {
		if _, err := seccompFilter(true, false, true, true); err != nil {
			b.Fatal(err)
		}
	}
}
