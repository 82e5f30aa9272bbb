//go:build unix

package audit

import (
	"fmt"
	"os"
	"syscall"
)

const (
	lockEx = syscall.LOCK_EX
	lockSh = syscall.LOCK_SH
)

// lockFile flocks f (lockEx or lockSh), waiting for it, and returns the
// unlock.
func lockFile(f *os.File, how int) (unlock func(), err error) {
	fd := int(f.Fd())
	for {
		err = syscall.Flock(fd, how)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("flock: %w", err)
	}
	return func() { syscall.Flock(fd, syscall.LOCK_UN) }, nil
}

// unlockFile drops the flock on f, whoever took it.
func unlockFile(f *os.File) { syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
