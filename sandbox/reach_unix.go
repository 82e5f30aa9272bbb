//go:build unix

package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Reach reports why u cannot reach path by its file modes: enter every
// directory on the way, and read it (a dir: list it) and, with exec, run
// it. nil when it can. It reads owner, group (u's primary one: the
// launcher drops supplementary groups) and other bits, not ACLs, so it is
// a diagnosis for operators (a pack under a 0700 dir), never a gate.
func (u User) Reach(path string, exec bool) error {
	return u.ReachFrom("/", path, exec)
}

// ReachFrom is Reach for a process whose working directory is base,
// entered for it by root: it needs to enter base and the directories
// below it on the way, none above. A path outside base is Reach's.
func (u User) ReachFrom(base, path string, exec bool) error {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	if p, err = filepath.Abs(p); err != nil {
		return err
	}
	if base, err = filepath.EvalSymlinks(base); err != nil {
		return err
	}
	if base, err = filepath.Abs(base); err != nil {
		return err
	}
	if !under(p, base) {
		base = "/"
	}
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		if err := u.may(dir, 1); err != nil {
			return err
		}
		if dir == base || dir == "/" {
			break
		}
	}
	want := uint32(4)
	if exec {
		want |= 1
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		want |= 1
	}
	return u.may(p, want)
}

// may checks the rwx bits want (4 read, 1 enter or run) of path for u.
func (u User) may(path string, want uint32) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || u.UID == 0 {
		return nil
	}
	mode := uint32(fi.Mode().Perm())
	bits := mode & 7
	switch {
	case int(st.Uid) == u.UID:
		bits = mode >> 6 & 7
	case int(st.Gid) == u.GID:
		bits = mode >> 3 & 7
	}
	if bits&want != want {
		return fmt.Errorf("%s is mode %04o, owned by %d:%d", path, mode, st.Uid, st.Gid)
	}
	return nil
}
