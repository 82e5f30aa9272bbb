//go:build linux && !capgate_noreserve

package audit

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// fallocate allocates n bytes at off in f without changing its size
// (FALLOC_FL_KEEP_SIZE), retrying when interrupted.
func fallocate(f fdFile, off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != syscall.EINTR {
			return err
		}
	}
}

// cannotReserve reports whether err from fallocate means the filesystem
// cannot reserve space at all, rather than that the disk is full.
func cannotReserve(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
}

// release frees the space reserved past size, when f is done with.
func release(f fdFile, size, n int64) {
	if n > 0 {
		_ = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE|unix.FALLOC_FL_PUNCH_HOLE, size, n)
	}
}
