package procs

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// The tests change GOMAXPROCS, which is the whole process's: none of them
// runs in parallel.

func TestObserveHysteresis(t *testing.T) {
	g := New(nil)
	g.Up, g.Down, g.Hold = 0.6, 0.3, 300*time.Millisecond
	tick := 100 * time.Millisecond
	steps := []struct {
		share float64
		busy  bool
	}{
		{0.1, false},
		{0.59, false}, // under Up
		{0.6, true},   // at Up: every P
		{0.5, true},   // between Down and Up: stays
		{0.2, true},   // under Down for 100ms
		{0.2, true},   // 200ms
		{0.4, true},   // back above Down: the hold starts over
		{0.2, true},
		{0.2, true},
		{0.2, false}, // 300ms under Down: one P
		{0.5, false}, // between: stays at one
		{1.7, true},
	}
	for i, s := range steps {
		g.observe(s.share, tick)
		if g.busy != s.busy {
			t.Fatalf("step %d (share %.2f): busy = %v, want %v", i, s.share, g.busy, s.busy)
		}
	}
}

// waitProcs waits up to d for GOMAXPROCS to be n.
func waitProcs(t *testing.T, n int, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for runtime.GOMAXPROCS(0) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOMAXPROCS = %d after %v, want %d", what, runtime.GOMAXPROCS(0), d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startGovernor runs a Governor with short periods and returns the
// runtime's default P count; it skips the test where there is only one.
func startGovernor(t *testing.T) (*Governor, int) {
	t.Helper()
	if !Enabled() {
		t.Skipf("GOMAXPROCS is set or there is one CPU (%d): nothing to govern", runtime.GOMAXPROCS(0))
	}
	max := runtime.GOMAXPROCS(0)
	g := New(nil)
	g.Tick, g.Hold = 20*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if got := runtime.GOMAXPROCS(0); got != max {
			t.Errorf("after Run: GOMAXPROCS = %d, want the default %d back", got, max)
		}
	})
	return g, max
}

func TestGovernorFollowsLoad(t *testing.T) {
	_, max := startGovernor(t)
	waitProcs(t, 1, 2*time.Second, "idle")

	// A goroutine that spins holds one core: the only P is not enough.
	var stop atomic.Bool
	spun := make(chan struct{})
	go func() {
		defer close(spun)
		for !stop.Load() {
			for i := 0; i < 1000; i++ {
			}
		}
	}()
	waitProcs(t, max, 2*time.Second, "one core busy")
	stop.Store(true)
	<-spun
	waitProcs(t, 1, 3*time.Second, "idle again")
}

func TestBlockingLendsEveryP(t *testing.T) {
	_, max := startGovernor(t)
	waitProcs(t, 1, 2*time.Second, "idle")
	end := Blocking()
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("in a Blocking section: GOMAXPROCS = %d, want %d", got, max)
	}
	end2 := Blocking() // sections nest
	end()
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("one of two sections ended: GOMAXPROCS = %d, want %d", got, max)
	}
	end2()
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("after the sections: GOMAXPROCS = %d, want 1", got)
	}
}

func TestBlockingWithoutGovernor(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	Blocking()()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS = %d, want %d untouched", got, before)
	}
}

func TestOperatorSettingWins(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	if Enabled() {
		t.Fatal("Enabled with GOMAXPROCS set in the environment")
	}
	before := runtime.GOMAXPROCS(0)
	g := New(nil)
	g.Tick = time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	g.Run(ctx) // returns at once
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS = %d, want %d untouched", got, before)
	}
}
