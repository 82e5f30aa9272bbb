package router

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"
)

// The in-memory buckets forget callers whose bucket is full again, and only
// them: a flood of new callers neither grows the map without bound nor
// refills a bucket that is still spent.
func TestLimiterForgetsIdleBuckets(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	var l limiter
	l.init(RateLimit{PerMinute: 60, Burst: 2}, func() time.Time { return now }, nil, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	take := func(sub string) bool {
		t.Helper()
		_, ok, err := l.take(ctx, sub, "mcp:s:t")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, ok := range []bool{true, true, false} {
		if got := take("alice"); got != ok {
			t.Fatalf("alice: take = %v, want %v", got, ok)
		}
	}
	// Three sweeps' worth of callers, each half spent: nothing is full, so
	// nothing is forgotten, and alice's bucket stays empty.
	for i := range 3 * minSweep {
		take("u" + strconv.Itoa(i))
	}
	if n := len(l.buckets); n != 3*minSweep+1 {
		t.Fatalf("%d buckets, want every spent one kept (%d)", n, 3*minSweep+1)
	}
	if take("alice") {
		t.Fatal("a flood of other callers gave alice a token back")
	}
	// Once every bucket is full again, the next sweep forgets them all:
	// only the callers that came since (still spent) are left.
	now = now.Add(3 * time.Second)
	for i := 0; len(l.buckets) != i; i++ {
		if i > 4*minSweep {
			t.Fatalf("%d buckets after %d new callers: idle ones are not forgotten", len(l.buckets), i)
		}
		take("v" + strconv.Itoa(i))
	}
	if _, kept := l.buckets[[2]string{"alice", "mcp:s:t"}]; kept {
		t.Fatal("alice's full bucket was not forgotten")
	}
	// A forgotten bucket is a full one.
	for _, ok := range []bool{true, true, false} {
		if got := take("alice"); got != ok {
			t.Fatalf("alice after the sweep: take = %v, want %v", got, ok)
		}
	}
	if ok, err := l.wouldTake(ctx, "nobody", "mcp:s:t"); err != nil || !ok {
		t.Errorf("wouldTake for a forgotten caller = %v, %v", ok, err)
	}
}
