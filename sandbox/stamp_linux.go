package sandbox

import (
	"time"

	"golang.org/x/sys/unix"
)

// stamp is what a file's stat says of its content: any write, rename over
// it or chmod changes its ctime, which no caller can set.
type stamp struct {
	valid    bool
	dev, ino uint64
	size     int64
	mtime    unix.Timespec
	ctime    unix.Timespec
	changed  time.Time
}

// stampOf stats path (following links, as exec does); regular says it is
// a regular file.
func stampOf(path string) (st stamp, regular bool) {
	var s unix.Stat_t
	if path == "" || unix.Stat(path, &s) != nil {
		return stamp{}, false
	}
	return stamp{valid: true, dev: uint64(s.Dev), ino: s.Ino, size: s.Size, mtime: s.Mtim, ctime: s.Ctim,
		changed: time.Unix(s.Ctim.Unix())}, s.Mode&unix.S_IFMT == unix.S_IFREG
}
