//go:build linux

package nsinit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// childEnv makes this test binary, started by init as its trampoline,
// report what it was given instead of running tests.
const childEnv = "CAPGATE_NSINIT_TEST_CHILD"

// childStatus is the child's exit status, which init must pass on.
const childStatus = 7

func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(childEnv); ok {
		reportChild()
	}
	os.Exit(m.Run())
}

// reportChild prints, one per line: its pid and parent's, what /proc/self
// names (the namespace's own /proc names it by its own pid), whether it
// saw Env, the descriptors it holds, and how many threads init runs; then
// exits childStatus.
func reportChild() {
	self, _ := os.Readlink("/proc/self")
	_, sawEnv := os.LookupEnv(Env)
	ents, _ := os.ReadDir("/proc/self/fd")
	var fds []string
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		fds = append(fds, e.Name()+">"+target)
	}
	initThreads := "?"
	if b, err := os.ReadFile("/proc/1/status"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				initThreads = strings.TrimSpace(v)
			}
		}
	}
	fmt.Printf("pid=%d\nppid=%d\nproc-self=%s\nenv=%v\nfds=%s\ninit-threads=%s\n",
		os.Getpid(), os.Getppid(), self, sawEnv, strings.Join(fds, ","), initThreads)
	os.Exit(childStatus)
}

// TestInitReaps: this test binary as a PID namespace's init (both ways a
// capgate can be built: with cgo, init is the C constructor; without, the
// Go init) starts the trampoline, itself again without Env, on the
// descriptors it was given, in the namespace's own /proc, and exits as it
// did. With cgo, init never starts Go: one thread.
func TestInitReaps(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{"this build": self}
	if cgoBuilt() {
		out := filepath.Join(t.TempDir(), "nsinit-nocgo.test")
		cmd := exec.Command("go", "test", "-c", "-o", out, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go test -c without cgo: %v\n%s", err, b)
		}
		bins["without cgo"] = out
	}
	for name, bin := range bins {
		t.Run(name, func(t *testing.T) {
			plan, err := os.CreateTemp(t.TempDir(), "plan")
			if err != nil {
				t.Fatal(err)
			}
			defer plan.Close()
			cmd := exec.Command(bin, "-test.run", "^$")
			cmd.Env = append(os.Environ(), childEnv+"=1", Env+"="+Value(-1, false))
			cmd.ExtraFiles = []*os.File{nil, nil, plan} // fd 5: the plan's place
			cmd.SysProcAttr = namespaces(t)
			out, err := cmd.Output()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != childStatus {
				t.Fatalf("want exit status %d passed on by init, got %v\n%s", childStatus, err, out)
			}
			got := map[string]string{}
			for line := range strings.Lines(string(out)) {
				k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
				got[k] = v
			}
			t.Logf("%v", got)
			if got["ppid"] != "1" || got["pid"] == "1" || got["proc-self"] != got["pid"] {
				t.Errorf("want the trampoline a child of init (pid 1) in the namespace's /proc, got %v", got)
			}
			if got["env"] != "false" {
				t.Errorf("the trampoline saw %s: it would take itself for init", Env)
			}
			if !strings.Contains(got["fds"], "5>"+plan.Name()) {
				t.Errorf("want the plan passed on at fd 5, got fds %s", got["fds"])
			}
			if name == "this build" && cgoBuilt() && got["init-threads"] != "1" {
				t.Errorf("with cgo, init should never start Go (one thread), got %s threads", got["init-threads"])
			}
		})
	}
}

// namespaces are the PID and mount namespaces the launcher gives a tool,
// in a user namespace where this test does not run as root.
func namespaces(t *testing.T) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		return attr
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("not root and no user namespaces")
	}
	uid, gid := os.Getuid(), os.Getgid()
	attr.Cloneflags |= syscall.CLONE_NEWUSER
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
	attr.AmbientCaps = []uintptr{capSysAdmin}
	return attr
}

// cgoBuilt reports whether this binary was built with cgo (then its init
// is the C constructor).
func cgoBuilt() bool { return cgoEnabled }
