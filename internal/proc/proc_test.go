package proc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEnv(t *testing.T) {
	host := map[string]string{"PATH": "/bin", "HOME": "/h", "SECRET": "s", "WANTED": "w"}
	lookup := func(n string) (string, bool) { v, ok := host[n]; return v, ok }
	got := Env(lookup, []string{"WANTED", "UNSET"}, "PATH=/mine", "EXTRA=x")
	want := []string{"HOME=/h", "PATH=/mine", "WANTED=w", "EXTRA=x"}
	if !slices.Equal(got, want) {
		t.Errorf("Env = %q, want %q", got, want)
	}
	// Nothing found is an empty environment, never nil (which inherits).
	if e := Env(func(string) (string, bool) { return "", false }, nil); e == nil || len(e) != 0 {
		t.Errorf("empty Env = %#v", e)
	}
}

// TestRunInheritsNothing: a subprocess with a nil or empty Env sees none
// of capgate's environment.
func TestRunInheritsNothing(t *testing.T) {
	t.Setenv("CAPGATE_PROC_TEST_SECRET", "must-not-leak")
	for _, env := range [][]string{nil, {}, Env(func(string) (string, bool) { return "", false }, nil)} {
		out, _, err := Run(context.Background(), Spec{Argv: []string{"/usr/bin/env"}, Env: env, Timeout: 10 * time.Second, MaxOutput: 1 << 16})
		if err != nil {
			t.Fatal(err)
		}
		if vars := strings.Fields(string(out)); len(vars) != 0 {
			t.Errorf("env %#v: the subprocess inherited %d variables", env, len(vars))
		}
	}
}
