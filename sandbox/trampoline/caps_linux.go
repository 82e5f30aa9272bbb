//go:build linux

package trampoline

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dropBounding empties the capability bounding set, so that nothing the
// tool execs can regain a capability. It takes CAP_SETPCAP: a trampoline
// without it (an unprivileged capgate with no user namespace) holds no
// capability to drop, and no_new_privs keeps exec from granting one.
func dropBounding() error {
	last := lastCap()
	for c := 0; c <= last; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past this kernel's last capability
		}
		if errors.Is(err, unix.EPERM) && !hasCap(unix.CAP_SETPCAP) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// lastCap is the kernel's highest capability number.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if n, err2 := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && err2 == nil {
		return n
	}
	return 63
}

func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// switchUser makes every thread uid:gid with no supplementary groups;
// leaving root clears the permitted and effective sets.
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
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// tieToCapgate sets the parent-death signal again (a user switch clears
// it) and then makes sure capgate had not already died: its pidfd turns
// readable when it exits. The pidfd is closed before the tool runs.
func (p Plan) tieToCapgate() error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	if p.Alive < 0 {
		return nil
	}
	defer unix.Close(p.Alive)
	fds := []unix.PollFd{{Fd: int32(p.Alive), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
		return errors.New("capgate exited before the tool started")
	}
	return nil
}

// sendListener is the trampoline's side: it loads prog with a listener and
// sends the listener's fd to capgate over NotifyFD, then closes both.
func sendListener(prog *unix.SockFprog) error {
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER,
		uintptr(unsafe.Pointer(prog)))
	if e != 0 {
		return fmt.Errorf("loading the notifying filter: %w", e)
	}
	listener := int(r)
	err := unix.Sendmsg(NotifyFD, []byte{0}, unix.UnixRights(listener), nil, 0)
	unix.Close(listener)
	unix.Close(NotifyFD)
	if err != nil {
		return fmt.Errorf("handing the listener to capgate: %w", err)
	}
	return nil
}
