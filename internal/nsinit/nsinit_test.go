//go:build linux

package nsinit

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestValueParses: what the launcher sends, init reads back.
func TestValueParses(t *testing.T) {
	for _, c := range []struct {
		alive  int
		notify bool
	}{{3, true}, {-1, false}, {3, false}} {
		alive, notify, err := parse(Value(c.alive, c.notify))
		if err != nil || alive != c.alive || notify != c.notify {
			t.Errorf("parse(Value(%d, %v)) = %d, %v, %v", c.alive, c.notify, alive, notify, err)
		}
	}
	for _, v := range []string{"", "1", ",1", "3,", "3,2", "a,1", "3;1", "3,1,1", "3,10"} {
		if _, _, err := parse(v); err == nil {
			t.Errorf("parse(%q) took it", v)
		}
	}
}

// TestInitFailsClosed: this test binary re-executed with Env set is the
// tool's init from its first package inits; outside a PID namespace of its
// own, or with a malformed Env, it refuses to start anything and ends as
// the launcher reports a start it refused (sandbox.StartFailed).
func TestInitFailsClosed(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ env, want string }{
		{"-1,0", "the tool's init is not PID 1 of a namespace"},
		{"3;1", `malformed CAPGATE_SANDBOX_INIT "3;1"`},
	} {
		cmd := exec.Command(self, "-test.run", "^$")
		cmd.Env = append(os.Environ(), Env+"="+c.env)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != StartFailure ||
			!strings.HasPrefix(string(out), FailPrefix) || !strings.Contains(string(out), c.want) {
			t.Errorf("%s=%s: %v\n%s", Env, c.env, err, out)
		}
	}
}
