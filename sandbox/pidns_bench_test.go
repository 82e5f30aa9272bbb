//go:build linux

package sandbox

import (
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// BenchmarkLaunchPidNS is what a tool's own PID namespace adds to its
// start (issue 30): /bin/true through the launcher, capgate itself the
// trampoline, with and without the namespace, for a tool with no
// guarantees and one with all of them. The namespace costs its init, the
// reaper: one more process, started from capgate's binary. Beside the
// wall time, cpu-ms/op is the CPU the started processes used (the child's
// rusage counts the descendants it waited for): on a loaded machine it
// says more than the wall time.
func BenchmarkLaunchPidNS(b *testing.B) {
	capgate := testkit.Build(b, testkit.CapgatePkg)
	f := Probe()
	if !f.PidNS {
		b.Skip("no PID namespace for a tool here")
	}
	noNS := f
	noNS.PidNS = false
	for _, g := range []struct {
		name string
		g    Guarantees
	}{{"none", Guarantees{}}, {"all", all()}} {
		if miss := f.Check(g.g); len(miss) > 0 {
			b.Logf("%s skipped: %v", g.name, miss)
			continue
		}
		for _, ns := range []struct {
			name string
			f    Features
		}{{"pidns", f}, {"nopidns", noNS}} {
			b.Run(g.name+"/"+ns.name, func(b *testing.B) {
				var cpu time.Duration
				for b.Loop() {
					cmd, cleanup, err := command(Spec{Path: "/bin/true", Guarantees: g.g, Trampoline: capgate}, ns.f)
					if err != nil {
						b.Fatal(err)
					}
					if out, err := cmd.CombinedOutput(); err != nil {
						b.Fatalf("%v: %s", err, out)
					}
					cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
					cleanup()
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}
