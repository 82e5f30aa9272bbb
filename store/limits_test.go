package store

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRateBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	perSec := 1.0 / 60 // one a minute
	take := func() bool {
		t.Helper()
		ok, err := s.TakeToken(ctx, "alice", "tool", perSec, 2)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take() || !take() {
		t.Fatal("a full bucket of 2 refused a take")
	}
	if take() {
		t.Fatal("an empty bucket gave a token")
	}
	if ok, _ := s.PeekToken(ctx, "alice", "tool", perSec, 2); ok {
		t.Error("peek at an empty bucket says a take would succeed")
	}
	// Another caller, another tool: their own buckets.
	if ok, _ := s.TakeToken(ctx, "bob", "tool", perSec, 2); !ok {
		t.Error("bob's bucket is not his own")
	}
	if ok, _ := s.TakeToken(ctx, "alice", "other", perSec, 2); !ok {
		t.Error("alice's bucket of another tool is not its own")
	}
	c.Advance(30 * time.Second)
	if take() {
		t.Error("half a token was taken")
	}
	c.Advance(30 * time.Second)
	if ok, _ := s.PeekToken(ctx, "alice", "tool", perSec, 2); !ok {
		t.Error("peek after a minute says no token")
	}
	if !take() {
		t.Error("after a minute, no token")
	}
	if take() {
		t.Error("a minute made two tokens")
	}
	if err := s.RefundToken(ctx, "alice", "tool", 2); err != nil {
		t.Fatal(err)
	}
	if !take() {
		t.Error("a refunded token was not given again")
	}
	// A long idle time fills the bucket to its burst, no further.
	c.Advance(time.Hour)
	if !take() || !take() || take() {
		t.Error("after an hour the bucket holds other than its burst of 2")
	}
	// A clock running backwards (another replica's) earns nothing.
	c.Advance(-10 * time.Minute)
	if take() {
		t.Error("a clock behind the bucket's refilled it")
	}
}

// TestRateBucketsConcurrent: takes from two stores (replicas) at once
// never spend a token twice.
func TestRateBucketsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	c := newClock()
	a, b := mustOpen(t, dir, c), mustOpen(t, dir, c)
	var got atomic.Int64
	var wg sync.WaitGroup
	for i := range 24 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			ok, err := s.TakeToken(ctx, "alice", "tool", 1.0/3600, 5)
			if err != nil {
				t.Error(err)
			}
			if ok {
				got.Add(1)
			}
		})
	}
	wg.Wait()
	if got.Load() != 5 {
		t.Errorf("%d tokens taken from a bucket of 5", got.Load())
	}
}

// BenchmarkTakeToken is what a rate limit adds to a call on a shared store.
func BenchmarkTakeToken(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.TakeToken(ctx, "alice", "mcp:fs:write", 1e9, 1e9); err != nil {
			b.Fatal(err)
		}
	}
}
