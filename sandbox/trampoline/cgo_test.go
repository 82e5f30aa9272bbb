//go:build linux && cgo

package trampoline

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCTrampolineRefusesMalformed: this test binary, with cgo, is the C
// trampoline from its first instruction; given a plan cut short, with a
// byte past its end, of another version, with a flag of 2 or a NUL in a
// path, it starts nothing and ends as the launcher reports a refused
// start (status 126, "capgate sandbox: reading the plan: ...").
func TestCTrampolineRefusesMalformed(t *testing.T) {
	full := Plan{Path: "/bin/true", Argv: []string{"/bin/true"}, Alive: -1, Landlock: true, HandledFS: 1,
		ReadDirs: []string{"/usr", "/etc"}, Filter: []uint64{Insn(6, 0, 0, 0x7fff0000)}, AuditTag: "t"}
	b := full.Encode()
	nul := full
	nul.ReadDirs = []string{"/us\x00r"}
	flag := Plan{Path: "/bin/true", Alive: -1}.Encode()
	flag[len(flag)-5] = 2 // SetUser
	cases := map[string][]byte{"past its end": append(b[:len(b):len(b)], 0), "JSON": []byte(`{"path":"/bin/true"}`),
		"flag of 2": flag, "NUL": nul.Encode(), "empty": nil}
	for n := 1; n < len(b); n += 1 + len(b)/12 {
		cases[fmt.Sprintf("cut to %d of %d bytes", n, len(b))] = b[:n]
	}
	for name, plan := range cases {
		f, err := os.CreateTemp(t.TempDir(), "plan")
		if err != nil {
			t.Fatal(err)
		}
		f.Write(plan)
		f.Seek(0, 0)
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), Env+"=5")
		cmd.ExtraFiles = []*os.File{nil, nil, f} // fd 5
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = cmd.Run()
		f.Close()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.HasPrefix(stderr.String(), "capgate sandbox: reading the plan: ") {
			t.Errorf("%s: %v, %q", name, err, stderr.String())
		}
	}
	// And the well-formed plan runs /bin/true.
	f, err := os.CreateTemp(t.TempDir(), "plan")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(Plan{Path: "/bin/true", Argv: []string{"/bin/true"}, Alive: -1}.Encode())
	f.Seek(0, 0)
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), Env+"=5")
	cmd.ExtraFiles = []*os.File{nil, nil, f}
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("a well-formed plan: %v, %q", err, out)
	}
}
