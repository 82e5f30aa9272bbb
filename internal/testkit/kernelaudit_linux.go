package testkit

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// ShareKernelAudit lets t use kernel audit alongside the other test
// processes that do, and leaves the machine as the first of them found it.
// Kernel audit is one switch for the machine: a test that read Landlock's
// records turned it off again at its end while another package's test,
// in another process, still counted on it. Each user holds a shared lock
// for its life; the last to leave turns audit off when the first to arrive
// found it off. isOn and set read and flip the switch.
func ShareKernelAudit(t testing.TB, isOn func() (bool, error), set func(bool) error) {
	t.Helper()
	shareSwitch(t, filepath.Join(os.TempDir(), "capgate-test-kernel-audit"), isOn, set)
}

// shareSwitch is ShareKernelAudit with its locks in dir.
func shareSwitch(t testing.TB, dir string, isOn func() (bool, error), set func(bool) error) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	guard := lockFile(t, filepath.Join(dir, "guard"), syscall.LOCK_EX) // orders arrivals and departures
	defer guard.Close()
	users, err := os.OpenFile(filepath.Join(dir, "users"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	found := filepath.Join(dir, "found")
	if syscall.Flock(int(users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		// The first user: note how audit was.
		on, err := isOn()
		if err != nil {
			users.Close()
			t.Skipf("kernel audit is not readable here: %v", err)
		}
		if err := os.WriteFile(found, []byte(map[bool]string{true: "on", false: "off"}[on]), 0o600); err != nil {
			users.Close()
			t.Fatal(err)
		}
	}
	if err := syscall.Flock(int(users.Fd()), syscall.LOCK_SH); err != nil {
		users.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		guard := lockFile(t, filepath.Join(dir, "guard"), syscall.LOCK_EX)
		defer guard.Close()
		defer users.Close()
		if syscall.Flock(int(users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return // another user still counts on it
		}
		if b, _ := os.ReadFile(found); string(b) == "off" {
			set(false)
		}
		os.Remove(found)
	})
}

// lockFile opens path and takes how (a flock operation) on it.
func lockFile(t testing.TB, path string, how int) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return f
}
