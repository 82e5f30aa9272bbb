//go:build linux

package sandbox

import (
	"os/exec"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// BenchmarkLaunch measures a tool's start-to-exit time plainly and through
// the launcher with every guarantee; the difference is what the launcher
// adds per subprocess call (the target: under 5 ms).
func BenchmarkLaunch(b *testing.B) {
	tool := testkit.Build(b, hostilePkg)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command(tool, "id").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	f := Probe()
	for _, c := range []struct {
		name string
		g    Guarantees
	}{{"sandboxed-none", Guarantees{}}, {"sandboxed-all", all()}} {
		if miss := f.Check(c.g); len(miss) > 0 {
			b.Logf("%s skipped: %v", c.name, miss)
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				cmd, cleanup, err := command(Spec{Path: tool, Args: []string{"id"}, Guarantees: c.g, Deny: []string{"/var/lib/capgate"}}, f)
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
