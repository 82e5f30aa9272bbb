package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// heldScript writes a pack dir with run.sh and returns the run, its dir
// and the launch capgate.lock would pin for it.
func heldScript(t testing.TB) (argv []string, dir string, pin Launch) {
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("echo v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	argv = []string{"/bin/sh", "run.sh", "data.json"}
	return argv, dir, NewLaunch(argv, dir, Declared{})
}

// noRacyWindow trusts a stat however recent its change (tests write
// their files just before checking them).
func noRacyWindow(t testing.TB) {
	old := racy
	racy = 0
	t.Cleanup(func() { racy = old })
}

// TestHeldRefusesWhatChangedOnDisk: each change to a pinned launch's
// files after it was pinned refuses the next start, named as the judge
// names it; one that keeps size and mtime (touch -r) still does, since the
// stat vouches only with its ctime; as pinned again, it starts.
func TestHeldRefusesWhatChangedOnDisk(t *testing.T) {
	noRacyWindow(t)
	argv, dir, pin := heldScript(t)
	var logged []string
	h := Hold("ext:p:c", argv, dir, func(msg string, args ...any) { logged = append(logged, msg) }, pin)
	script, data := filepath.Join(dir, "run.sh"), filepath.Join(dir, "data.json")
	refused := func(want string) {
		t.Helper()
		err := h.Check()
		var changed *ChangedError
		if !errors.As(err, &changed) || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), "changed since capgate.lock pinned it") {
			t.Fatalf("Check = %v, want a refusal naming %q", err, want)
		}
		if r := changed.Refusal(); r.Code != "capability_access_denied" || r.Gate != "definition_pin" || !strings.HasPrefix(r.Message, "ext:p:c not run: ") {
			t.Fatalf("Refusal = %+v", r)
		}
	}
	for range 2 { // the second from the stat it cached
		if err := h.Check(); err != nil {
			t.Fatalf("unchanged launch refused: %v", err)
		}
	}
	// Same size, mtime put back: only ctime (and the bytes) differ.
	fi, err := os.Stat(script)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("echo v2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(script, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	refused("file run.sh sha256 ")
	if len(logged) != 1 {
		t.Fatalf("the refusal was not logged once: %q", logged)
	}
	if err := os.WriteFile(script, []byte("echo v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Check(); err != nil {
		t.Fatalf("refused once as pinned again: %v", err)
	}
	// An argument that named no file when pinned now does.
	if err := os.WriteFile(data, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("file data.json sha256 (not a file when pinned)")
	if err := os.Remove(data); err != nil {
		t.Fatal(err)
	}
	// Vanished, or unreadable in its place (a dir): fail closed.
	if err := os.Remove(script); err != nil {
		t.Fatal(err)
	}
	refused("file run.sh sha256 ")
	if err := os.Mkdir(script, 0o755); err != nil {
		t.Fatal(err)
	}
	refused("(no longer a file)")
}

// TestHeldProgram: the program is held too, and a pin written before
// files were digested vouches for none of them (as the judge).
func TestHeldProgram(t *testing.T) {
	noRacyWindow(t)
	dir := t.TempDir()
	prog := filepath.Join(dir, "tool")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	argv := []string{prog, "x"}
	pin := NewLaunch(argv, dir, Declared{})
	pin.Files = nil // pinned before file digests
	h := Hold("bridge:b", argv, dir, nil, pin, pin)
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Check(); err != nil {
		t.Fatalf("a file the pin does not vouch for refused the start: %v", err)
	}
	if err := os.WriteFile(prog, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := h.Check()
	if err == nil || strings.Count(err.Error(), "program sha256 ") != 1 {
		t.Fatalf("Check = %v, want the changed program named once", err)
	}
	if Hold("x", argv, dir, nil) != nil || (*Held)(nil).Check() != nil {
		t.Fatal("no pin must mean no check")
	}
}

// BenchmarkHeldCheck is what holding a pinned launch adds to each start
// (`/bin/sh run.sh data.json`: program, script, a non-file argument):
// unchanged, a stat per file; after a change, the hashes.
func BenchmarkHeldCheck(b *testing.B) {
	noRacyWindow(b)
	argv, dir, pin := heldScript(b)
	h := Hold("ext:p:c", argv, dir, nil, pin)
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			if err := h.Check(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rehash", func(b *testing.B) {
		for b.Loop() {
			for _, f := range h.files {
				f.seen = stamp{} // as after a change: every file hashed
			}
			if err := h.Check(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
