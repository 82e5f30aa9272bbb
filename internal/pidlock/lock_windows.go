//go:build windows

package pidlock

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

var errWouldBlock = windows.ERROR_LOCK_VIOLATION

// tryLock locks one byte far past the pid exclusively, without waiting
// (LockFileEx): Windows locks are mandatory, and a locked pid could not be
// read to name the holder.
func tryLock(f *os.File) error {
	ol := &windows.Overlapped{OffsetHigh: 0x7fffffff}
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_IO_PENDING) {
		return errWouldBlock
	}
	return err
}
