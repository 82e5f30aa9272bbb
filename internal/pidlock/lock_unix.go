//go:build unix

package pidlock

import (
	"os"
	"syscall"
)

var errWouldBlock = syscall.EWOULDBLOCK

// tryLock flocks f exclusively without waiting. The lock lives as long as
// the open file, so a holder that dies releases it.
func tryLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
