//go:build linux

package trampoline

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestStrayDescriptorsCloseOnExec: both ways closeStray works (close_range,
// and the /proc walk of kernels before 5.11) leave a descriptor opened
// without close-on-exec marked close-on-exec. cmd/capgate's
// TestToolGetsNoStrayDescriptor is the attack through capgate serve.
func TestStrayDescriptorsCloseOnExec(t *testing.T) {
	for name, mark := range map[string]func() error{"close_range": closeStray, "proc": cloexecListed} {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0) // no O_CLOEXEC
		if err != nil {
			t.Fatal(err)
		}
		flags := func() int {
			f, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		if flags()&unix.FD_CLOEXEC != 0 {
			t.Fatalf("%s: the descriptor is close-on-exec before the test", name)
		}
		if err := mark(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if flags()&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s: descriptor %d is not close-on-exec", name, fd)
		}
		unix.Close(fd)
	}
}
