//go:build linux

package trampoline

import (
	"syscall"
	"unsafe"
)

// The kernel's numbers this package uses, here rather than from
// golang.org/x/sys/unix: that package's init (and go-landlock's,
// go-seccomp-bpf's, which import it) sorts late in capgate's import
// order, and Go runs this package's init, the trampoline, only after all
// of its imports' (see doc.go). TestNumbersAreTheKernels checks each
// against x/sys/unix.
const (
	// System calls numbered alike on every architecture (the unified
	// table, from 424 on).
	sysCloseRange            = 436
	sysLandlockCreateRuleset = 444
	sysLandlockAddRule       = 445
	sysLandlockRestrictSelf  = 446

	prSetPdeathsig       = 1
	prSetName            = 15
	prCapbsetDrop        = 24
	prSetNoNewPrivs      = 38
	prCapAmbient         = 47
	prCapAmbientClearAll = 4

	capSetpcap              = 8
	linuxCapabilityV3       = 0x20080522
	closeRangeCloexec       = 1 << 2
	seccompSetModeFilter    = 1
	seccompNewListener      = 1 << 3
	seccompWaitKillableRecv = 1 << 5
	landlockRulePathBeneath = 1
	pollIn                  = 0x1
)

func prctl(op, arg uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, op, arg, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// The kernel's struct __user_cap_header_struct and __user_cap_data_struct.
type capHeader struct {
	version uint32
	pid     int32
}

type capData struct{ effective, permitted, inheritable uint32 }

// capget and capset act on the calling thread (pid 0).
func capget(data *[2]capData) error {
	hdr := capHeader{version: linuxCapabilityV3}
	if _, _, e := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return e
	}
	return nil
}

func capset(data *[2]capData) error {
	hdr := capHeader{version: linuxCapabilityV3}
	if _, _, e := syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return e
	}
	return nil
}
