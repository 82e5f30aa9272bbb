package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestConfigCheckJSON runs the real binary's `config check --json` on a
// good config, a bad one and none: one JSON object on stdout each time,
// with the text form's exit status and problems, and nothing on stderr.
func TestConfigCheckJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := testkit.Build(t, testkit.CapgatePkg)
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[server]\nlisten = \"localhost\"\nlistne = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		exit     int
		ok       bool
		problems []string
	}{
		{"good", []string{"--config", filepath.Join("..", "..", "examples", "quickstart", "capgate.toml")}, 0, true, nil},
		{"bad", []string{"--config", bad}, 2, false, []string{bad + `:2: server.listen: "localhost" is not host:port`, bad + ":3: server.listne: unknown key (did you mean listen?)"}},
		{"no config", nil, 2, false, []string{"--config is required"}},
	} {
		cmd := exec.Command(bin, append([]string{"config", "check", "--json"}, tc.args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var res configCheckResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Errorf("%s: stdout is not one JSON object: %v\n%s", tc.name, err, out)
			continue
		}
		if code != tc.exit || res.OK != tc.ok || stderr.Len() != 0 {
			t.Errorf("%s: exit %d ok %v stderr %q, want exit %d ok %v and no stderr", tc.name, code, res.OK, stderr.String(), tc.exit, tc.ok)
		}
		if strings.Join(res.Problems, "\n") != strings.Join(tc.problems, "\n") || res.Notes == nil || res.Problems == nil {
			t.Errorf("%s: problems %q (notes %q), want %q", tc.name, res.Problems, res.Notes, tc.problems)
		}
	}
}
