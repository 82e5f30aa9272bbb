//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// runPrefix names the dir each capgate process keeps its launches'
// private temp dirs in. The process holds an exclusive flock on it while
// it lives; the kernel drops the lock when the process dies, however it
// dies (SIGKILL, OOM), so a dir whose lock is free belongs to no live
// capgate and the next capgate to start removes it with every launch's
// temp dir in it. A dir under a tmpfs mounted by the tool's init would
// vanish with the namespace, but only where there is a PID namespace:
// this works wherever capgate runs, and the tool's view stays as it was.
const runPrefix = "capgate-run-"

// tempRoot is this process's locked dir, made at the first launch (and
// again if ReleaseTemp removed it). The first call sweeps the dead ones.
func tempRoot() (string, error) {
	rootMu.Lock()
	defer rootMu.Unlock()
	if holdRoot != nil && same(holdRoot, rootDir) {
		return rootDir, nil
	}
	if holdRoot != nil {
		holdRoot.Close()
		holdRoot = nil
	}
	if !swept {
		SweepTemp()
		swept = true
	}
	for range 3 {
		dir, err := os.MkdirTemp("", runPrefix)
		if err != nil {
			return "", fmt.Errorf("sandbox: private temp dirs: %w", err)
		}
		// Searchable, not listable: a tool running as another user
		// reaches its own dir and cannot list the others'.
		if err := os.Chmod(dir, 0o711); err != nil {
			os.Remove(dir)
			return "", fmt.Errorf("sandbox: private temp dirs: %w", err)
		}
		f, err := lockDir(dir)
		if err != nil {
			os.Remove(dir) // swept before it was locked, or unlockable: another
			continue
		}
		// Another capgate's sweep may have taken the dir between its
		// creation and the lock: locked, it must still be the one there.
		if same(f, dir) {
			rootDir, holdRoot = dir, f // held, open, while the process uses it
			return dir, nil
		}
		f.Close()
	}
	return "", errors.New("sandbox: private temp dirs: the dir kept being removed under capgate")
}

var (
	rootMu  sync.Mutex
	rootDir string
	// holdRoot keeps rootDir's lock: closing it frees the dir to sweeps.
	holdRoot *os.File
	swept    bool
)

// PrepareTemp removes what capgate processes that died left in the temp
// dir and takes this process's own dir for its launches' temp dirs. serve
// calls it at start; the first launch calls it otherwise.
func PrepareTemp() error {
	_, err := tempRoot()
	return err
}

// SweepTemp removes every capgate-run-* dir in os.TempDir() that this
// user owns and no live process has locked: what a killed capgate left.
func SweepTemp() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runPrefix+"*"))
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() { // a symlink is not ours to follow
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			continue
		}
		f, err := lockDir(dir)
		if err != nil {
			continue // held: a live capgate's
		}
		if same(f, dir) {
			os.RemoveAll(dir)
		}
		f.Close()
	}
}

// lockDir opens dir and takes its exclusive lock without waiting.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// same reports whether the open f is still the dir at path.
func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// ReleaseTemp removes this process's dir if no launch's temp dir is left
// in it (a capgate that ends normally has ended its tools); one still in
// use stays, locked, until the process dies and a later start sweeps it.
func ReleaseTemp() {
	rootMu.Lock()
	defer rootMu.Unlock()
	if holdRoot != nil && os.Remove(rootDir) == nil {
		holdRoot.Close()
		holdRoot = nil
	}
}
