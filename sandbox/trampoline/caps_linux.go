//go:build linux

package trampoline

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// dropBounding empties this thread's capability bounding set, so that
// nothing the tool execs can regain a capability. It takes CAP_SETPCAP: a
// trampoline without it (an unprivileged capgate with no user namespace)
// holds no capability to drop, and no_new_privs keeps exec from granting
// one. Capabilities are numbered from 0 with no gap, and the kernel
// answers EINVAL past its last: the loop stops there, with no need to read
// /proc/sys/kernel/cap_last_cap.
func dropBounding() error {
	for c := uintptr(0); c < 64; c++ {
		err := prctl(prCapbsetDrop, c)
		if errors.Is(err, syscall.EINVAL) {
			return nil // past this kernel's last capability
		}
		if errors.Is(err, syscall.EPERM) && !hasCap(capSetpcap) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

func hasCap(c int) bool {
	var data [2]capData
	if err := capget(&data); err != nil {
		return false
	}
	return data[c/32].effective&(1<<(c%32)) != 0
}

// switchUser makes every thread uid:gid with no supplementary groups
// (package syscall's calls change every thread of the process, this one,
// which execs the tool, included); leaving root clears the permitted and
// effective sets.
func switchUser(uid, gid int) error {
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	return nil
}

// dropCaps clears the ambient, effective, permitted and inheritable sets
// of this thread, the one that execs the tool.
func dropCaps() error {
	if err := prctl(prCapAmbient, prCapAmbientClearAll); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("clearing the ambient set: %w", err)
	}
	var data [2]capData
	if err := capset(&data); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// tieToCapgate sets the parent-death signal again (a user switch clears
// it) and then makes sure capgate had not already died: its pidfd turns
// readable when it exits. The pidfd is closed before the tool runs.
func (p Plan) tieToCapgate() error {
	if err := prctl(prSetPdeathsig, uintptr(syscall.SIGKILL)); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	if p.Alive < 0 {
		return nil
	}
	defer syscall.Close(p.Alive)
	// struct pollfd, polled once without waiting (ppoll: arm64 has no poll).
	fds := struct {
		fd              int32
		events, revents int16
	}{fd: int32(p.Alive), events: pollIn}
	var zero syscall.Timespec
	n, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	if e == 0 && n > 0 {
		return errors.New("capgate exited before the tool started")
	}
	return nil
}

// sendListener is the trampoline's side: it loads prog with a listener and
// sends the listener's fd to capgate over NotifyFD, then closes both.
//
// capgate records a notified syscall before it answers it (see
// sandbox/notify_linux.go), so the tool waits while it records. With
// WAIT_KILLABLE_RECV (Linux 5.19) that wait, once capgate has received the
// notification, ends only with the answer or a fatal signal: a signal (a Go
// tool's preemption SIGURG, a timer) cannot break it off, which would
// restart the syscall and notify it again, and again while each record
// outlasts the signals between them. A kernel without the flag refuses it
// (EINVAL): the filter loads without it there.
func sendListener(prog *syscall.SockFprog) error {
	r, _, e := syscall.Syscall(sysSeccomp, seccompSetModeFilter, seccompNewListener|seccompWaitKillableRecv, uintptr(unsafe.Pointer(prog)))
	if e == syscall.EINVAL {
		r, _, e = syscall.Syscall(sysSeccomp, seccompSetModeFilter, seccompNewListener, uintptr(unsafe.Pointer(prog)))
	}
	if e != 0 {
		return fmt.Errorf("loading the notifying filter: %w", e)
	}
	listener := int(r)
	err := syscall.Sendmsg(NotifyFD, []byte{0}, syscall.UnixRights(listener), nil, 0)
	syscall.Close(listener)
	syscall.Close(NotifyFD)
	if err != nil {
		return fmt.Errorf("handing the listener to capgate: %w", err)
	}
	return nil
}
