package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLaunchDigestIsTheOldPin: capgate.lock files written before launches
// were pinned whole hold an extension command's launch as this digest
// (session 12's launchDigest, reproduced here); Digest must equal it, or
// every such lock would quarantine its tools.
func TestLaunchDigestIsTheOldPin(t *testing.T) {
	decl := Declared{Filesystem: "read", Network: "none", ReadPaths: []string{"/srv"}, Pack: &Declared{Env: "none"}}
	l := NewLaunch([]string{"/bin/sh", "-c", "true"}, "", decl)
	if l.Program == "missing" {
		t.Fatal("/bin/sh not digested")
	}
	b, _ := json.Marshal(struct {
		Run      []string `json:"run"`
		Program  string   `json:"program_sha256"`
		Declared Declared `json:"declared"`
	}{l.Run, l.Program, decl})
	sum := sha256.Sum256(b)
	if want := "sha256:" + hex.EncodeToString(sum[:]); l.Digest() != want {
		t.Errorf("Digest %s, the old pin %s", l.Digest(), want)
	}
	var back Launch
	if err := json.Unmarshal(l.JSON(), &back); err != nil || back.Digest() != l.Digest() {
		t.Errorf("a launch read back from the lock digests differently: %v", err)
	}
}

func TestCompareLaunchWrites(t *testing.T) {
	pinned := Launch{Declared: Declared{Filesystem: "write", WritePaths: []string{"/srv/out"}}}
	for _, tt := range []struct {
		now      Declared
		loosened bool
	}{
		{Declared{Filesystem: "write", WritePaths: []string{"/srv/out/a"}}, false},
		{Declared{Filesystem: "read"}, false},
		{Declared{Filesystem: "write", WritePaths: []string{"/srv"}}, true},
		{Declared{}, true}, // undeclared: writes anywhere
	} {
		if changes, loosened := CompareLaunch(pinned, Launch{Declared: tt.now}); loosened != tt.loosened {
			t.Errorf("%+v: loosened %v (%v), want %v", tt.now, loosened, changes, tt.loosened)
		}
	}
}

// TestLaunchDigestsFiles: each argument naming a regular file (relative
// to the work dir, or absolute) is pinned by its sha256; a changed,
// appearing or vanished file loosens; a pin from before file digests
// loosens for none of them but vouches for none (UnpinnedFiles).
func TestLaunchDigestsFiles(t *testing.T) {
	dir := t.TempDir()
	script, data := filepath.Join(dir, "server.py"), filepath.Join(dir, "data.txt")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(script, "print('hi')\n")
	argv := []string{"/bin/sh", "server.py", "--flag", dir, "/nonexistent/x.py", "later.py"}
	pinned := NewLaunch(argv, dir, Declared{})
	if len(pinned.Files) != 1 || pinned.Files["server.py"] == "" || pinned.Files["server.py"] == "missing" {
		t.Fatalf("files pinned: %v (only server.py is a file)", pinned.Files)
	}
	if _, loosened := CompareLaunch(pinned, NewLaunch(argv, dir, Declared{})); loosened {
		t.Error("an unchanged launch loosens")
	}
	write(script, "import os; print(os.environ)\n")
	write(filepath.Join(dir, "later.py"), "x\n")
	now := NewLaunch(argv, dir, Declared{})
	changes, loosened := CompareLaunch(pinned, now)
	if !loosened || len(changes) != 2 || !strings.HasPrefix(changes[0], "file later.py sha256 (not a file when pinned) → ") ||
		!strings.HasPrefix(changes[1], "file server.py sha256 "+pinned.Files["server.py"][:12]) {
		t.Errorf("a changed and an appearing file: %v, loosened %v", changes, loosened)
	}
	if err := os.Remove(script); err != nil {
		t.Fatal(err)
	}
	if changes, loosened := CompareLaunch(now, NewLaunch(argv, dir, Declared{})); !loosened || !strings.Contains(changes[0], "server.py") {
		t.Errorf("a vanished file: %v, loosened %v", changes, loosened)
	}
	// Absolute, and the pin before file digests.
	write(data, "1\n")
	abs := NewLaunch([]string{"/bin/cat", data}, "", Declared{})
	var old Launch
	if err := json.Unmarshal(abs.V1(), &old); err != nil || old.Files != nil || strings.Contains(string(abs.V1()), "files") {
		t.Fatalf("V1 %s holds files", abs.V1())
	}
	write(data, "2\n")
	if changes, loosened := CompareLaunch(old, NewLaunch([]string{"/bin/cat", data}, "", Declared{})); loosened {
		t.Errorf("a pin from before file digests loosened: %v", changes)
	}
	if got := UnpinnedFiles(old, abs); len(got) != 1 || got[0] != data {
		t.Errorf("UnpinnedFiles %v, want [%s]", got, data)
	}
	if got := UnpinnedFiles(abs, abs); got != nil {
		t.Errorf("UnpinnedFiles of a pin with digests: %v", got)
	}
}
