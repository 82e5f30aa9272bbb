package audit

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Rotation: when the file would grow past MaxSize, it is moved aside as
// <path>.<seq of its last line> and the chain continues in a new file at
// path, whose first line's prev is the hash of that last line and whose
// seq follows on. Seqs are numbered across files, so the names sort in
// chain order and VerifyFile can follow the chain from file to file. Only
// MaxFiles moved-aside files are kept; the oldest are deleted.

// rotatedFile is a moved-aside file of the log: its path and the seq its
// name says its last line has.
type rotatedFile struct {
	path string
	last uint64
}

// rotatedFiles lists the moved-aside files of the log at path, oldest first.
func rotatedFiles(path string) ([]rotatedFile, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []rotatedFile
	for _, e := range ents {
		// <base>.<seq>: ParseUint takes digits only (no sign, no "_").
		rest, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok || strings.HasPrefix(rest, "0") {
			continue
		}
		n, err := strconv.ParseUint(rest, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, rotatedFile{filepath.Join(dir, e.Name()), n})
	}
	slices.SortFunc(out, func(a, b rotatedFile) int { return cmp.Compare(a.last, b.last) })
	return out, nil
}

// prune deletes the oldest moved-aside files so that at most keep remain.
func (l *Log) prune(keep int) error {
	files, err := rotatedFiles(l.path)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	for len(files) > keep {
		if err := os.Remove(files[0].path); err != nil {
			return fmt.Errorf("audit: pruning old log files: %w", err)
		}
		files = files[1:]
	}
	return nil
}

// rotate moves the current file aside and opens a new, empty one at path,
// with disk space reserved ahead of it. When that space cannot be
// reserved it changes nothing and returns the error: the current file's
// own reservation still holds the records already promised, and the file
// may outgrow MaxSize until the disk has room. Call with iomu and the
// current file's flock held; on success the new file's flock is held
// instead, and the old file is closed.
func (l *Log) rotate() error {
	// The old file must be complete and durable before it is renamed.
	if l.wroteSeq > l.synced {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("audit: %s: fsync: %w", l.path, err)
		}
		l.syncs.Add(1)
		if err := l.writeHead(l.wroteSeq, &l.wroteHash); err != nil {
			return err
		}
		l.synced = l.wroteSeq
	}
	if err := l.prune(l.maxFiles - 1); err != nil {
		return err
	}
	tmp := l.path + ".new"
	nf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if _, err := lockFile(nf, lockEx); err != nil {
		nf.Close()
		os.Remove(tmp)
		return fmt.Errorf("audit: %s: %w", tmp, err)
	}
	var reserved int64
	if err := l.reserveAhead(nf, 0, &reserved); err != nil {
		nf.Close()
		os.Remove(tmp)
		return err
	}
	aside := l.path + "." + strconv.FormatUint(l.wroteSeq, 10)
	if err := os.Rename(l.path, aside); err != nil {
		nf.Close()
		os.Remove(tmp)
		return fmt.Errorf("audit: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		// The log has no file at path now; the next Open creates one
		// that chains to the file moved aside.
		nf.Close()
		return fmt.Errorf("audit: %w", err)
	}
	if err := l.dir.Sync(); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	release(l.f, l.size, l.reserved-l.size)
	l.replaceFile(nf)
	l.size, l.reserved = 0, reserved
	l.account(0)
	return nil
}

// replaceFile makes nf, flocked, the file l writes, and closes the one it
// replaces (dropping its flock).
func (l *Log) replaceFile(nf *os.File) {
	old := l.f
	l.f = nf
	if l.w == old {
		l.w = nf
	}
	old.Close()
}

// follow reopens path when the file this Log holds was moved aside by
// another Log sharing it, and takes the chain's tail from the moved file.
// Call with iomu and l.f's flock held; on return l.f's flock is held.
func (l *Log) follow() error {
	cur, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	st, err := os.Stat(l.path)
	if err == nil && os.SameFile(cur, st) {
		return nil
	}
	// The file was rotated: it holds the chain's last lines, complete
	// and synced, since rotation happens under its flock.
	seq, hash, err := readTail(l.f, cur.Size(), l.f.Name())
	if err != nil {
		return err
	}
	nf, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if _, err := lockFile(nf, lockEx); err != nil {
		nf.Close()
		return fmt.Errorf("audit: %s: %w", l.path, err)
	}
	l.replaceFile(nf)
	l.size, l.wroteSeq, l.wroteHash, l.synced, l.reserved = 0, seq, hash, seq, 0
	l.account(0)
	return nil
}

// lastRotated returns the seq and hash of the last line of the newest
// moved-aside file, for a log whose current file is empty; 0 and the
// zero hash when there is none.
func lastRotated(path string) (uint64, [sha256.Size]byte, error) {
	files, err := rotatedFiles(path)
	if err != nil || len(files) == 0 {
		return 0, [sha256.Size]byte{}, err
	}
	p := files[len(files)-1].path
	f, err := os.Open(p)
	if err != nil {
		return 0, [sha256.Size]byte{}, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, [sha256.Size]byte{}, fmt.Errorf("audit: %w", err)
	}
	return readTail(f, st.Size(), p)
}
