package testkit

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// NPMCI installs the packages a test needs, pinned by dir's package.json
// and package-lock.json, with npm ci into a cache under $TMPDIR named by
// the two files' hash, and returns the install's directory (with its
// node_modules). A later call with the same files finds it there. Without
// npm the test skips, unless $CI is set: then it fails.
func NPMCI(tb testing.TB, dir string) string {
	tb.Helper()
	npm, err := exec.LookPath("npm")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatal("npm not found, and CI must run this test")
		}
		tb.Skip("npm not found: this test installs npm packages")
	}
	h := sha256.New()
	files := map[string][]byte{}
	for _, name := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			tb.Fatalf("the pinned npm install: %v", err)
		}
		files[name] = b
		h.Write(b)
	}
	cache := filepath.Join(os.TempDir(), "capgate-npm")
	into := filepath.Join(cache, filepath.Base(dir)+"-"+hex.EncodeToString(h.Sum(nil)[:6]))
	if _, err := os.Stat(filepath.Join(into, "node_modules")); err == nil {
		return into
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		tb.Fatal(err)
	}
	// Install into a fresh directory and rename it into place, so a
	// concurrent test binary doing the same never sees half an install.
	tmp, err := os.MkdirTemp(cache, ".tmp-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	cmd := exec.Command(npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("npm ci of %s: %v\n%s", dir, err, out)
		}
		tb.Skipf("npm could not install %s (no registry?): %v\n%s", dir, err, out)
	}
	if err := os.Rename(tmp, into); err != nil {
		if _, statErr := os.Stat(filepath.Join(into, "node_modules")); statErr != nil {
			tb.Fatalf("moving the npm install into place: %v", err)
		}
	}
	return into
}
