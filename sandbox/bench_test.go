//go:build linux

package sandbox

import (
	"os/exec"
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
