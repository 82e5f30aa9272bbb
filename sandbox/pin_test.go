package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
