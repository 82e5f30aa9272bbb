//go:build linux

package sandbox

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestExecedToolIsConfined: the trampoline confines the one thread that
// execs the tool (a Landlock domain, no_new_privs, a seccomp filter and
// the capability sets are each the calling thread's, and execve keeps
// them; go-landlock's all-thread calls through libpsx are gone), so the
// tool after that exec must hold every one of them. The kernel's account
// of the tool (/proc/self/status) and its attempts say so: with and
// without a PID namespace, as capgate's user and as run_as, started by a
// root and by an unprivileged capgate. Its one seccomp filter is the two
// the trampoline loaded before (Seccomp_filters: 1).
//
// It runs through both trampolines: the C constructor of a cgo build (this
// test binary, as capgate) and the Go one of a build without cgo.
func TestExecedToolIsConfined(t *testing.T) {
	t.Run("C", func(t *testing.T) { execedToolIsConfined(t, false) })
	t.Run("Go", func(t *testing.T) { execedToolIsConfined(t, true) })
}

func execedToolIsConfined(t *testing.T, inGo bool) {
	f := Probe()
	g := all()
	needs(t, f, g)
	var w world
	tramp := ""
	public := f.Privileged && f.UserNS
	if public {
		w, tramp = nobodyWorld(t, f) // the tool and outside.txt readable by nobody
	} else {
		w = newWorld(t)
	}
	launcher := tramp // this test binary, where nobody reaches it
	if inGo {
		dir := t.TempDir()
		if public {
			dir = filepath.Dir(tramp) // where nobody reaches it
		}
		tramp = goTrampoline(t, dir)
	}
	capgate := strconv.Itoa(os.Getpid())
	attempts := []string{"status", "read=" + w.outside, "signal=" + capgate}
	results := func(t *testing.T, out []byte) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			a, r, _ := strings.Cut(line, " ")
			got[a] = r
		}
		t.Logf("%q", got)
		return got
	}
	// Control: the tool started plainly reads, signals, and is unconfined.
	out, err := exec.Command(w.tool, attempts...).Output()
	if err != nil {
		t.Fatal(err)
	}
	control := results(t, out)
	if !strings.HasPrefix(control["read="+w.outside], "ok") || !strings.HasPrefix(control["signal="+capgate], "ok") ||
		!strings.Contains(control["status"], "NoNewPrivs=0") {
		t.Fatalf("unconfined, the tool was refused already: %q", control)
	}
	check := func(t *testing.T, got map[string]string, uid int, signalScoped bool) {
		t.Helper()
		id := strconv.Itoa(uid)
		status := " " + strings.TrimPrefix(got["status"], "ok ") + " "
		for _, want := range []string{"NoNewPrivs=1", "Seccomp=2", "Seccomp_filters=1",
			"CapInh=0000000000000000", "CapPrm=0000000000000000", "CapEff=0000000000000000",
			"CapBnd=0000000000000000", "CapAmb=0000000000000000",
			"Uid=" + id + "," + id + "," + id + "," + id} {
			if !strings.Contains(status, " "+want+" ") {
				t.Errorf("the tool's status lacks %s: %s", want, status)
			}
		}
		if !strings.HasPrefix(got["read="+w.outside], "denied") {
			t.Errorf("read %s: %s", w.outside, got["read="+w.outside])
		}
		if signalScoped && !strings.HasPrefix(got["signal="+capgate], "denied") {
			t.Errorf("signal to capgate: %s", got["signal="+capgate])
		}
	}
	// Landlock scopes signals from ABI 6 on; a PID namespace hides
	// capgate anyway.
	scoped := landlockABI() >= 6
	noNS := f
	noNS.PidNS = false
	for _, c := range []struct {
		name string
		f    Features
		cred *syscall.Credential
		uid  int
	}{{"pidns", f, nil, os.Getuid()}, {"nopidns", noNS, nil, os.Getuid()}, {"run_as", f, nobody, 65534}} {
		t.Run(c.name, func(t *testing.T) {
			if c.cred != nil && !public {
				t.Skip("needs root and user namespaces to run a tool as nobody")
			}
			cmd, cleanup, err := command(Spec{Path: w.tool, Args: attempts, Dir: w.work, Guarantees: g,
				Credential: c.cred, Trampoline: tramp}, c.f)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			check(t, results(t, out), c.uid, scoped || c.f.PidNS)
		})
	}
	t.Run("unprivileged capgate", func(t *testing.T) {
		if !public {
			t.Skip("needs root and user namespaces to run capgate as nobody")
		}
		spec := Spec{Path: w.tool, Args: attempts, Dir: w.work, Guarantees: g}
		if inGo {
			spec.Trampoline = tramp
		}
		js, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(launcher)
		cmd.Env = []string{launchAsEnv + "=" + string(js)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		check(t, results(t, out), 65534, true) // nobody may not signal root's capgate anyway
	})
}

// goTrampoline builds the trampoline's Go implementation (a build without
// cgo) into dir, for Spec.Trampoline.
func goTrampoline(t *testing.T, dir string) string {
	t.Helper()
	tramp := filepath.Join(dir, "gotrampoline")
	cmd := exec.Command("go", "build", "-o", tramp, "github.com/capgate/capgate/internal/testkit/gotrampoline")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build without cgo: %v\n%s", err, out)
	}
	return tramp
}
