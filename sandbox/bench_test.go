//go:build linux

package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// BenchmarkLaunch measures a tool's start-to-exit time plainly and through
// the launcher with every guarantee, the test binary or capgate itself as
// the trampoline; the difference is what the launcher adds per subprocess
// call (the target: under 5 ms). The tools: the hostile command
// printing its uid, and /bin/true.
func BenchmarkLaunch(b *testing.B) {
	tool := testkit.Build(b, hostilePkg)
	// The launcher as it runs in production: the capgate binary is the
	// trampoline, with every package of it to initialise.
	capgate := testkit.Build(b, testkit.CapgatePkg)
	f := Probe()
	for _, prog := range []struct {
		name string
		argv []string
	}{{"", []string{tool, "id"}}, {"true/", []string{"/bin/true"}}} {
		b.Run(prog.name+"direct", func(b *testing.B) {
			for b.Loop() {
				if err := exec.Command(prog.argv[0], prog.argv[1:]...).Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, c := range []struct {
			name       string
			g          Guarantees
			trampoline string
			observe    func(Key) // denials seen by capgate, as for a call
		}{{"sandboxed-none", Guarantees{}, "", nil}, {"sandboxed-all", all(), "", nil}, {"capgate-all", all(), capgate, nil},
			{"capgate-all-observed", all(), capgate, func(Key) {}}} {
			if miss := f.Check(c.g); len(miss) > 0 {
				b.Logf("%s skipped: %v", c.name, miss)
				continue
			}
			b.Run(prog.name+c.name, func(b *testing.B) {
				for b.Loop() {
					cmd, cleanup, err := command(Spec{Path: prog.argv[0], Args: prog.argv[1:], Guarantees: c.g,
						Deny: []string{"/var/lib/capgate"}, Trampoline: c.trampoline, Observe: c.observe}, f)
					if err != nil {
						b.Fatal(err)
					}
					if out, err := cmd.CombinedOutput(); err != nil {
						b.Fatalf("%v: %s", err, out)
					}
					cleanup()
				}
			})
		}
	}
}

// BenchmarkRefusedSyscall measures what one refused syscall costs a tool
// when capgate is told of it (seccomp user notification: the syscall
// waits for capgate's supervisor to answer) and when the kernel answers
// it alone (plain seccomp errno): the tool makes 20000 socket() calls under
// no_network, so the difference of ns/op / 20000 is the cost of one. This is the price a
// supervisor that had every open() handed to it, to attribute file
// denials, would pay per open, on every call, refused or not.
func BenchmarkRefusedSyscall(b *testing.B) {
	tool := testkit.Build(b, hostilePkg)
	f := Probe()
	g := guarantee(NoNetwork)
	if miss := f.Check(g); len(miss) > 0 || !f.Seccomp {
		b.Skipf("cannot refuse sockets here: %v", miss)
	}
	for _, c := range []struct {
		name    string
		observe func(Key)
	}{{"errno", nil}, {"notified", func(Key) {}}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				cmd, cleanup, err := command(Spec{Path: tool, Args: []string{"sockets=20000"}, Guarantees: g, Observe: c.observe}, f)
				if err != nil {
					b.Fatal(err)
				}
				out, err := cmd.CombinedOutput()
				cleanup()
				if err != nil || !strings.Contains(string(out), "20000 refused") {
					b.Fatalf("%v: %s", err, out)
				}
			}
		})
	}
}

// BenchmarkStderrReport measures what naming a refused file from a failed
// call's stderr costs (where capgate reads no audit): the stderr tail
// capgate keeps (StderrTail) with one refusal at its end, checked against
// the launch's rules. A call that succeeds pays nothing.
func BenchmarkStderrReport(b *testing.B) {
	dir := b.TempDir()
	secret := filepath.Join(dir, "notes")
	if err := os.WriteFile(secret, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	stderr := strings.Repeat("INFO some ordinary line the tool logs at work\n", 60) +
		"Traceback (most recent call last):\nPermissionError: [Errno 13] Permission denied: '" + secret + "'\n"
	r := &rules{readDirs: SystemDirs, writeDirs: []string{"/tmp/capgate-tool-x"}}
	for b.Loop() {
		d := Denials{rules: r}
		d.Stderr(stderr)
		if len(d.files) != 1 {
			b.Fatalf("named %v", d.files)
		}
	}
}
