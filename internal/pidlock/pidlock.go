// Package pidlock holds a file for one process at a time: an exclusive
// flock on a file that carries the holder's pid, so that a second process
// is refused with the holder named and never touches what the first one
// owns (its pid file, its socket).
package pidlock

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrHeld is wrapped by Acquire's error when another process holds the
// lock.
var ErrHeld = errors.New("held by another process")

// Lock is a held lock; Release gives it up.
type Lock struct {
	path string
	f    *os.File
}

// Acquire takes the lock at path for this process, without waiting, and
// writes this process's pid into the file. When another process holds it,
// the error wraps ErrHeld and names that process's pid.
func Acquire(path string) (*Lock, error) {
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := tryLock(f); err != nil {
			f.Close()
			if errors.Is(err, errWouldBlock) {
				return nil, fmt.Errorf("%s is %w (pid %s)", path, ErrHeld, holder(path))
			}
			return nil, fmt.Errorf("%s: lock: %w", path, err)
		}
		// A holder that was releasing may have removed the file after we
		// opened it: then the lock we hold is on a file nobody else sees.
		if same(f, path) {
			if err := f.Truncate(0); err == nil {
				_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return &Lock{path: path, f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%s: its holders keep changing; try again", path)
}

// Release removes the file, still holding the lock, then drops it.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.path)
	l.f.Close()
	l.f = nil
}

// holder is the pid the file at path names, or "unknown".
func holder(path string) string {
	b, err := os.ReadFile(path)
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
		return strconv.Itoa(pid)
	}
	return "unknown"
}

// same reports whether f is still the file at path.
func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}
