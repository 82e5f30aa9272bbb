package audit

import (
	"fmt"
	"os"

	"golang.org/x/sys/windows"
)

const (
	lockEx = windows.LOCKFILE_EXCLUSIVE_LOCK
	lockSh = 0
)

// Windows byte-range locks are mandatory: locking the records would make
// other handles' reads fail. So, as SQLite does, the lock is one byte far
// past any real data, used only as a mutex between handles, like flock.
const (
	lockOffHigh = 0x7fffffff // offset 0x7fffffff_00000000
	lockLen     = 1
)

// lockFile locks f (lockEx or lockSh) with LockFileEx, waiting for it, and
// returns the unlock. As with flock, the lock belongs to the handle.
func lockFile(f *os.File, how int) (unlock func(), err error) {
	ol := windows.Overlapped{OffsetHigh: lockOffHigh}
	if err := windows.LockFileEx(windows.Handle(f.Fd()), uint32(how), 0, lockLen, 0, &ol); err != nil {
		return nil, fmt.Errorf("LockFileEx: %w", err)
	}
	return func() { unlockFile(f) }, nil
}

// unlockFile drops the lock lockFile took on f.
func unlockFile(f *os.File) {
	ol := windows.Overlapped{OffsetHigh: lockOffHigh}
	_ = windows.UnlockFileEx(windows.Handle(f.Fd()), 0, lockLen, 0, &ol)
}
