package testkit

import (
	"sync"
	"testing"
)

// user is one test of ShareKernelAudit's, whose end the test chooses.
type user struct {
	testing.TB
	cleanups []func()
}

func (u *user) Cleanup(f func()) { u.cleanups = append(u.cleanups, f) }

func (u *user) leave() {
	for i := len(u.cleanups) - 1; i >= 0; i-- {
		u.cleanups[i]()
	}
}

// TestShareSwitch: of two users that overlap, the first to arrive leaving
// first, only the last to leave turns the switch off, and only when the
// first found it off; one found on stays on.
func TestShareSwitch(t *testing.T) {
	for _, found := range []bool{false, true} {
		dir := t.TempDir()
		var mu sync.Mutex
		on, offs := found, 0
		isOn := func() (bool, error) { mu.Lock(); defer mu.Unlock(); return on, nil }
		set := func(v bool) error {
			mu.Lock()
			defer mu.Unlock()
			on = v
			if !v {
				offs++
			}
			return nil
		}
		a, b := &user{TB: t}, &user{TB: t}
		shareSwitch(a, dir, isOn, set)
		set(true) // as serve does
		shareSwitch(b, dir, isOn, set)
		a.leave()
		if !on {
			t.Errorf("found on=%v: the first to leave turned it off while the other still uses it", found)
		}
		b.leave()
		if want := map[bool]int{false: 1, true: 0}[found]; on != found || offs != want {
			t.Errorf("found on=%v: after both left it is on=%v, turned off %d times, want %d", found, on, offs, want)
		}
	}
}
