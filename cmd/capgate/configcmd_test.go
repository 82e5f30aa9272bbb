package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// configCheck writes src as capgate.toml in a temp dir and runs
// `capgate config check` on it.
func configCheck(t *testing.T, src string) (dir, path, stdout, stderr string, code int) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "capgate.toml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code = run([]string{"config", "check", "--config", path}, &out, &errb)
	return dir, path, out.String(), errb.String(), code
}

func TestConfigCheckOK(t *testing.T) {
	dir, path, stdout, stderr, code := configCheck(t, `
[server]
data_dir = "data"

[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fs.*"]

[policy.subjects.alice]
grants = ["rye.execute.tool.*"]
`)
	if code != 0 || stdout != path+": OK\n" || stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// Nothing was started or made: serve would have made the data
	// directory and its development token key.
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("config check made the data directory: %v", err)
	}
}

func TestConfigCheckProblems(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string // the lines of stderr, with FILE for the config's path
	}{
		{"unknown key", "[server]\nlisten = \"127.0.0.1:0\"\nbogus = 1\n",
			[]string{"FILE:3: server.bogus: unknown key"}},
		{"invalid grants", "[policy]\n\ngrants = [\"not a cap\", \"\"]\n",
			[]string{`FILE:3: policy.grants[0]: grant "not a cap" contains white space or a control character`, "FILE:3: policy.grants[1]: empty grant"}},
		{"files serve reads at startup", "[policy]\ngrants = [\"rye.fetch.*\"]\nrisk_file = \"missing.yaml\"\n\n[auth]\njwks_file = \"jwks.json\"\nallow_hs256 = true\n",
			[]string{"FILE:3: policy.risk_file: ", "FILE:6: auth.jwks_file: "}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, path, stdout, stderr, code := configCheck(t, c.src)
			got := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if code != 2 || stdout != "" || len(got) != len(c.want) {
				t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, stdout, stderr)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(got[i], strings.ReplaceAll(w, "FILE", path)) {
					t.Errorf("line %d: %q, want %q", i+1, got[i], w)
				}
			}
		})
	}
}

// TestVersionFlag: `capgate --version` prints what `capgate version` does.
func TestVersionFlag(t *testing.T) {
	var a, b, errb bytes.Buffer
	if code := run([]string{"version"}, &a, &errb); code != 0 {
		t.Fatalf("version: exit %d %s", code, errb.String())
	}
	if code := run([]string{"--version"}, &b, &errb); code != 0 {
		t.Fatalf("--version: exit %d %s", code, errb.String())
	}
	if !strings.HasPrefix(a.String(), "capgate ") || a.String() != b.String() {
		t.Errorf("version %q, --version %q", a.String(), b.String())
	}
}
