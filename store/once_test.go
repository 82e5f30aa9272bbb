package store

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
)

// A key is claimed once, by whichever of two stores on one data directory
// (two processes, two replicas) comes first, until it expires; Prune then
// drops it.
func TestClaimOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	dir := t.TempDir()
	a, b := mustOpen(t, dir, c), mustOpen(t, dir, c)
	exp := c.Now().Add(time.Minute)

	if err := a.ClaimOnce(ctx, "state:1", exp); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	for name, s := range map[string]*Store{"same store": a, "another store": b} {
		if err := s.ClaimOnce(ctx, "state:1", exp); !errors.Is(err, ErrExists) {
			t.Errorf("second claim on the %s: %v, want ErrExists", name, err)
		}
	}
	if err := b.ClaimOnce(ctx, "state:2", exp); err != nil {
		t.Errorf("another key: %v", err)
	}
	for name, bad := range map[string]struct {
		key string
		exp time.Time
	}{"empty key": {"", exp}, "past expiry": {"state:3", c.Now()}} {
		if err := a.ClaimOnce(ctx, bad.key, bad.exp); err == nil || errors.Is(err, ErrExists) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// Many claimants at once: exactly one wins.
	var wins sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 8 {
		wins.Add(1)
		go func() {
			defer wins.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			err := s.ClaimOnce(ctx, "state:race", exp)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrExists):
				t.Errorf("racing claim: %v", err)
			}
		}()
	}
	wins.Wait()
	if won != 1 {
		t.Errorf("%d racing claims won, want 1", won)
	}

	count := func() (n int) {
		if err := a.ops.QueryRow(`SELECT COUNT(*) FROM once_claims`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := a.Prune(ctx); err != nil || count() != 3 {
		t.Fatalf("Prune of live claims: %v, %d left", err, count())
	}
	c.Advance(time.Minute)
	if err := a.Prune(ctx); err != nil || count() != 0 {
		t.Errorf("Prune of expired claims: %v, %d left", err, count())
	}
	// An expired claim (not yet pruned) may be made again.
	if err := a.ClaimOnce(ctx, "state:1", c.Now().Add(time.Minute)); err != nil {
		t.Errorf("claim after expiry: %v", err)
	}
}

// BenchmarkClaimOnce is what each continuation of a requestState adds:
// one conditional upsert in the shared store.
func BenchmarkClaimOnce(b *testing.B) {
	s := mustOpen(b, b.TempDir(), nil)
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	i := 0
	for b.Loop() {
		i++
		if err := s.ClaimOnce(ctx, "state:"+strconv.Itoa(i), exp); err != nil {
			b.Fatal(err)
		}
	}
}

// Claimed sees a live claim from any store on the data directory, and
// neither an unknown key nor an expired claim.
func TestClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	dir := t.TempDir()
	a, b := mustOpen(t, dir, c), mustOpen(t, dir, c)
	if err := a.ClaimOnce(ctx, "session-ended:s1", c.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"session-ended:s1": true, "session-ended:s2": false} {
		if got, err := b.Claimed(ctx, key); err != nil || got != want {
			t.Errorf("Claimed(%q) = %v, %v; want %v", key, got, err, want)
		}
	}
	c.Advance(2 * time.Minute)
	if got, err := b.Claimed(ctx, "session-ended:s1"); err != nil || got {
		t.Errorf("Claimed after expiry = %v, %v; want false", got, err)
	}
}
