// Package procs sizes GOMAXPROCS to capgate's load: one P while one core is
// plenty, the runtime's default when it is not.
//
// capgate mostly waits on sockets. With an idle P to spare, the scheduler
// wakes a second thread whenever the network makes two goroutines runnable
// at once, and that thread goes back to sleep a few microseconds later. On
// a small virtual machine each such round trip costs more CPU than
// capgate's own work on a call. One P runs the same goroutines in turn.
//
// One P has two costs, and the Governor bounds both. Calls wait for each
// other when one core is busy: above Up of a core, capgate takes every P.
// A blocking system call (an fsync) holds the only P until the runtime
// notices, up to tens of milliseconds: code that blocks on the disk wraps
// it in Blocking, which lends it the other Ps meanwhile.
package procs

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Governor moves GOMAXPROCS between 1 and the runtime's default. The zero
// value is not ready; use New.
type Governor struct {
	// Tick is how often capgate's CPU time is sampled.
	Tick time.Duration
	// Up is the share of one core at or above which one P is not enough.
	Up float64
	// Down is the share of a core below which capgate goes back to one P,
	// once it has stayed below it for Hold.
	Down float64
	Hold time.Duration
	// Logger hears each change.
	Logger *slog.Logger

	mu       sync.Mutex
	max      int           // the runtime's default
	busy     bool          // the load wants max
	low      time.Duration // how long the load has been below Down
	blocking int           // Blocking sections under way
	running  bool          // between the start and the end of Run
}

// New returns a Governor with the defaults: sampled every 100ms, every P
// from 60% of a core, back to one after 5s under 30%.
func New(logger *slog.Logger) *Governor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Governor{Tick: 100 * time.Millisecond, Up: 0.6, Down: 0.3, Hold: 5 * time.Second, Logger: logger}
}

// current is the running Governor, which Blocking lends Ps through.
var current atomic.Pointer[Governor]

// Enabled reports whether a Governor should run: the operator did not set
// GOMAXPROCS, and there is more than one P to move between.
func Enabled() bool {
	return os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > 1
}

// Run governs GOMAXPROCS until ctx ends, then gives the runtime its
// default back. Only one Governor runs at a time; Run returns at once if
// another does, or if Enabled is false.
func (g *Governor) Run(ctx context.Context) {
	if !Enabled() || !current.CompareAndSwap(nil, g) {
		return
	}
	defer current.Store(nil)
	g.mu.Lock()
	g.max = runtime.GOMAXPROCS(0)
	g.busy, g.low, g.running = false, 0, true
	g.applyLocked()
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.running = false
		runtime.SetDefaultGOMAXPROCS()
		g.mu.Unlock()
	}()

	t := time.NewTicker(g.Tick)
	defer t.Stop()
	last, lastAt := cpuTime(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu := cpuTime()
			dt := now.Sub(lastAt)
			if dt > 0 {
				g.observe(float64(cpu-last)/float64(dt), dt)
			}
			last, lastAt = cpu, now
		}
	}
}

// observe takes the share of a core capgate used over the last dt.
func (g *Governor) observe(share float64, dt time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !g.busy && share >= g.Up:
		g.busy, g.low = true, 0
		g.Logger.Info("procs: taking every P", "procs", g.max, "core_share", round2(share))
	case g.busy && share < g.Down:
		g.low += dt
		if g.low >= g.Hold {
			g.busy, g.low = false, 0
			g.Logger.Info("procs: back to one P", "core_share", round2(share), "below_for", g.Hold)
		}
	case g.busy:
		g.low = 0
	}
	g.applyLocked()
}

// applyLocked sets GOMAXPROCS to what the load and the Blocking sections
// under way want.
func (g *Governor) applyLocked() {
	if !g.running {
		return
	}
	want := 1
	if g.busy || g.blocking > 0 {
		want = g.max
	}
	switch {
	case want == runtime.GOMAXPROCS(0):
	case want == g.max:
		// The runtime's default, which also follows a changed CPU quota.
		runtime.SetDefaultGOMAXPROCS()
		g.max = runtime.GOMAXPROCS(0)
	default:
		runtime.GOMAXPROCS(want)
	}
}

// Blocking marks the start of work that blocks a thread in the kernel (an
// fsync, a file lock); calling what it returns marks the end. While a
// Governor holds capgate to one P, it lends every P meanwhile, so that
// the rest of capgate goes on. Without a Governor it costs nothing.
func Blocking() (end func()) {
	g := current.Load()
	if g == nil {
		return nothing
	}
	g.block(1)
	return func() { g.block(-1) }
}

// block counts a Blocking section in (1) or out (-1).
func (g *Governor) block(d int) {
	g.mu.Lock()
	g.blocking += d
	g.applyLocked()
	g.mu.Unlock()
}

func nothing() {}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }
