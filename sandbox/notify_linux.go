//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// A tool whose denials capgate observes (Spec.Observe) has the syscalls
// its no_network and no_subprocess guarantees refuse, socket() of any
// family but AF_UNIX and fork/vfork/clone without CLONE_THREAD, handed to
// capgate by seccomp user notification (SECCOMP_RET_USER_NOTIF): the
// trampoline loads the filter with a listener and passes the listener's fd
// to capgate over a socketpair (SCM_RIGHTS, fd 4 in the trampoline), and a
// supervisor goroutine reports each such syscall and then answers it
// EPERM (answer says why in that order). If capgate stops answering, the
// kernel fails the syscall (ENOSYS): closed.

// The kernel's struct seccomp_notif and seccomp_notif_resp.
type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// supervisor is capgate's side of one confined process's notifications.
type supervisor struct {
	conn    *net.UnixConn // capgate's end of the socketpair
	child   *os.File      // the trampoline's end, given as ExtraFiles[1] (fd 4)
	wake    [2]int        // a pipe whose write end stop closes
	observe func(Key)
	done    chan struct{}
	once    sync.Once
}

// newSupervisor makes the socketpair and starts waiting for the listener.
func newSupervisor(observe func(Key)) (*supervisor, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: notification socketpair: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "capgate-notify")
	c, err := net.FileConn(parent)
	parent.Close() // FileConn holds its own copy
	if err != nil {
		unix.Close(fds[1])
		return nil, fmt.Errorf("sandbox: notification socket: %w", err)
	}
	s := &supervisor{conn: c.(*net.UnixConn), child: os.NewFile(uintptr(fds[1]), "capgate-notify-child"),
		observe: observe, done: make(chan struct{})}
	if err := unix.Pipe2(s.wake[:], unix.O_CLOEXEC); err != nil {
		s.conn.Close()
		s.child.Close()
		return nil, fmt.Errorf("sandbox: notification pipe: %w", err)
	}
	go s.run()
	return s, nil
}

// stop ends the supervisor and waits for it: call it once the process has
// ended. Syscalls still waiting on the listener then fail.
func (s *supervisor) stop() {
	s.once.Do(func() {
		s.child.Close()
		s.conn.Close() // wakes a wait for the listener
		unix.Close(s.wake[1])
		<-s.done
		unix.Close(s.wake[0])
	})
}

func (s *supervisor) run() {
	defer close(s.done)
	listener, err := s.receive()
	if err != nil {
		return // the trampoline ended (or failed, exiting 126) before sending
	}
	defer unix.Close(listener)
	for {
		fds := []unix.PollFd{{Fd: int32(listener), Events: unix.POLLIN}, {Fd: int32(s.wake[0]), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 || fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			return // stopped, or every process under the filter has ended
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			s.answer(listener)
		}
	}
}

// receive reads the listener's fd that the trampoline sends.
func (s *supervisor) receive() (int, error) {
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("sandbox: no listener in the trampoline's message")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("sandbox: want one listener fd")
	}
	return fds[0], nil
}

// answer takes one notification, reports which guarantee it was, and
// then refuses the syscall with EPERM: in that order, so that the tool
// cannot see the refusal (and answer its call with an error) before
// capgate has recorded it, and a call's result never misses the denial
// that failed it. The tool's syscall waits meanwhile: observe must be
// quick and must not wait on the tool. The trampoline loads the filter
// with WAIT_KILLABLE_RECV where the kernel has it, so that no signal
// breaks that wait off (which restarts the syscall and notifies it anew);
// on an older kernel a signal may, and the new notification is observed
// again (the observers keep each guarantee once) and answered.
func (s *supervisor) answer(listener int) {
	var n seccompNotif // the kernel wants it zeroed
	if err := ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
		return // the process died meanwhile (ENOENT), or was interrupted
	}
	if k, ok := notifiedKey(n.Nr); ok {
		s.observe(k)
	}
	resp := seccompNotifResp{ID: n.ID, Error: -int32(unix.EPERM)}
	_ = ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
}

// notifiedKey is the guarantee a notified syscall breaks.
// The filter notifies only this architecture's syscalls (archGuard), so
// its table names them; x/sys/unix has no SYS_FORK on arm64.
func notifiedKey(nr int32) (Key, bool) {
	info, err := arch.GetInfo("")
	if err != nil {
		return "", false
	}
	switch info.SyscallNumbers[int(nr)] {
	case "socket":
		return NoNetwork, true
	case "clone", "fork", "vfork":
		return NoSubprocess, true
	}
	return "", false
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}
