//go:build linux

package trampoline

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// Landlock's filesystem access rights, and the sets go-landlock's RODirs,
// ROFiles, RWDirs and RWFiles grant (its accessFSRead, accessFSReadWrite
// and accessFile): TestAccessIsGoLandlocks checks them against it.
const (
	llExecute = 1 << iota
	llWriteFile
	llReadFile
	llReadDir
	llRemoveDir
	llRemoveFile
	llMakeChar
	llMakeDir
	llMakeReg
	llMakeSock
	llMakeFifo
	llMakeBlock
	llMakeSym
	llRefer
	llTruncate

	accessRead  = llExecute | llReadFile | llReadDir
	accessWrite = llWriteFile | llRemoveDir | llRemoveFile | llMakeChar | llMakeDir | llMakeReg | llMakeSock |
		llMakeFifo | llMakeBlock | llMakeSym | llTruncate
	accessFile = llExecute | llWriteFile | llTruncate | llReadFile
)

// restrict is what go-landlock's Config.Restrict did here, done on this
// thread alone: the ruleset handles what the launcher decided this
// kernel's ABI has (Plan.HandledFS, HandledNet, Scoped, RestrictFlags), each
// path rule grants its class of rights within that, a path gone since the
// launcher listed it is skipped (IgnoreIfMissing), and the thread sets
// no_new_privs and restricts itself.
//
// Why this thread alone is enough, where go-landlock restricted every
// thread (with libpsx): a Landlock domain, no_new_privs, a seccomp filter
// without TSYNC and the capability sets are each the calling thread's,
// and execve keeps them; every other thread of the process ends at that
// execve, before the tool's first instruction. This thread is locked
// (apply), runs nothing after restricting itself but this package's code,
// and execs the tool; the other threads are the Go runtime's and run no
// code of the tool's ever. TestExecedToolIsConfined checks the tool's
// state after the exec.
func (p Plan) restrict() error {
	if p.HandledFS == 0 && p.HandledNet == 0 && p.Scoped == 0 {
		return errors.New("the plan's ruleset handles nothing") // a launcher bug: fail closed
	}
	attr := struct{ fs, net, scoped uint64 }{p.HandledFS, p.HandledNet, p.Scoped}
	r, _, e := syscall.RawSyscall(sysLandlockCreateRuleset, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	ruleset := int(r)
	defer syscall.Close(ruleset)
	for _, c := range []struct {
		paths  []string
		access uint64
	}{{p.ReadDirs, accessRead}, {p.ReadFiles, accessRead & accessFile},
		{p.WriteDirs, accessRead | accessWrite}, {p.WriteFiles, (accessRead | accessWrite) & accessFile}} {
		access := c.access & p.HandledFS
		if access == 0 {
			continue // a rule granting nothing is an error to the kernel
		}
		for _, path := range c.paths {
			if err := addPath(ruleset, path, access); err != nil {
				return err
			}
		}
	}
	if err := prctl(prSetNoNewPrivs, 1); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, e := syscall.RawSyscall(sysLandlockRestrictSelf, uintptr(ruleset), uintptr(p.RestrictFlags), 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

// addPath lets the ruleset grant access under path; a missing path is
// skipped.
func addPath(ruleset int, path string, access uint64) error {
	fd, err := syscall.Open(path, oPath|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %q for its rule: %w", path, err)
	}
	defer syscall.Close(fd)
	// The kernel's struct landlock_path_beneath_attr is packed, 12 bytes:
	// this struct's first 12.
	attr := struct {
		access uint64
		fd     int32
	}{access, int32(fd)}
	if _, _, e := syscall.RawSyscall6(sysLandlockAddRule, uintptr(ruleset), landlockRulePathBeneath,
		uintptr(unsafe.Pointer(&attr)), 0, 0, 0); e != 0 {
		return fmt.Errorf("landlock_add_rule for %q with access %#x: %w", path, access, e)
	}
	return nil
}
