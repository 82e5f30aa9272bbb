package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestClaimIdempotency: a claim is taken once; the others see it in
// progress, then its result; a released claim is taken again; a claim
// whose holder stops renewing it reads as dead and is never taken over
// until its record expires, only retaken on purpose.
func TestClaimIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)

	claim, rec, err := s.ClaimIdempotency(ctx, "alice", "tool", "k", "h1", time.Minute, time.Hour)
	if err != nil || claim == "" || rec != nil {
		t.Fatalf("first claim: %q %+v %v", claim, rec, err)
	}
	other, rec, err := s.ClaimIdempotency(ctx, "alice", "tool", "k", "h1", time.Minute, time.Hour)
	if err != nil || other != "" || rec == nil || !rec.InProgress || rec.InputHash != "h1" || rec.Result != nil {
		t.Fatalf("second claim while the first runs: %q %+v %v", other, rec, err)
	}
	if _, err := s.Idempotency(ctx, "alice", "tool", "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a claim read as a result: %v", err)
	}
	// Released: the next call runs.
	if err := s.ReleaseIdempotency(ctx, "alice", "tool", "k", claim); err != nil {
		t.Fatal(err)
	}
	claim, _, err = s.ClaimIdempotency(ctx, "alice", "tool", "k", "h1", time.Minute, time.Hour)
	if err != nil || claim == "" {
		t.Fatalf("claim after release: %q %v", claim, err)
	}
	// Completed: the others replay.
	if err := s.CompleteIdempotency(ctx, "alice", "tool", "k", claim, []byte(`{"r":1}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	_, rec, err = s.ClaimIdempotency(ctx, "alice", "tool", "k", "h2", time.Minute, time.Hour)
	if err != nil || rec == nil || rec.InProgress || rec.InputHash != "h1" || string(rec.Result) != `{"r":1}` {
		t.Fatalf("claim after completion: %+v %v", rec, err)
	}
	// Releasing a completed record's old claim does nothing.
	if err := s.ReleaseIdempotency(ctx, "alice", "tool", "k", claim); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Idempotency(ctx, "alice", "tool", "k"); err != nil || string(r.Result) != `{"r":1}` {
		t.Fatalf("after a stale release: %+v %v", r, err)
	}

	// A claim whose holder stops renewing reads as dead once its lease
	// has passed, and stays dead, never taken over by a claim, until the
	// record's keep has passed.
	dead, _, _ := s.ClaimIdempotency(ctx, "alice", "tool", "k2", "h", time.Second, time.Hour)
	c.Advance(900 * time.Millisecond)
	if err := s.RenewIdempotency(ctx, "alice", "tool", "k2", dead, time.Second); err != nil {
		t.Fatal(err)
	}
	c.Advance(900 * time.Millisecond) // renewed: alive past the first lease
	if _, rec, err := s.ClaimIdempotency(ctx, "alice", "tool", "k2", "h", time.Second, time.Hour); err != nil || rec == nil || !rec.InProgress || rec.Dead {
		t.Fatalf("a renewed claim: %+v %v", rec, err)
	}
	c.Advance(101 * time.Millisecond)
	for _, after := range []time.Duration{0, 59 * time.Minute} {
		c.Advance(after)
		next, rec, err := s.ClaimIdempotency(ctx, "alice", "tool", "k2", "h", time.Second, time.Hour)
		if err != nil || next != "" || rec == nil || !rec.InProgress || !rec.Dead {
			t.Fatalf("claim %v after the lease ended: %q %+v %v", after, next, rec, err)
		}
	}
	// Retaken (a call safe to repeat), once; the dead holder's completion
	// is refused, the new holder's renewal is not.
	if again, err := s.RetakeIdempotency(ctx, "alice", "tool", "k2", "other input", time.Second); err != nil || again != "" {
		t.Fatalf("retake with another input: %q %v", again, err)
	}
	next, err := s.RetakeIdempotency(ctx, "alice", "tool", "k2", "h", time.Second)
	if err != nil || next == "" || next == dead {
		t.Fatalf("retake of a dead claim: %q %v", next, err)
	}
	if again, err := s.RetakeIdempotency(ctx, "alice", "tool", "k2", "h", time.Second); err != nil || again != "" {
		t.Fatalf("second retake: %q %v", again, err)
	}
	if err := s.CompleteIdempotency(ctx, "alice", "tool", "k2", dead, []byte("x"), time.Hour); !errors.Is(err, ErrNotFound) {
		t.Errorf("retaken claim completed: %v", err)
	}
	if err := s.RenewIdempotency(ctx, "alice", "tool", "k2", dead, time.Second); !errors.Is(err, ErrNotFound) {
		t.Errorf("retaken claim renewed: %v", err)
	}
	if err := s.RenewIdempotency(ctx, "alice", "tool", "k2", next, time.Second); err != nil {
		t.Errorf("renewing the new claim: %v", err)
	}
	// Past keep, the record is forgotten and the key runs again.
	c.Advance(time.Hour)
	if again, _, err := s.ClaimIdempotency(ctx, "alice", "tool", "k2", "h", time.Second, time.Hour); err != nil || again == "" {
		t.Fatalf("claim after keep: %q %v", again, err)
	}
	if _, _, err := s.ClaimIdempotency(ctx, "alice", "tool", "k2", "h", 0, time.Hour); err == nil {
		t.Error("a zero lease was accepted")
	}
}

// TestClaimIdempotencyRace: of concurrent claims (in two Stores on one
// file, as two processes would), exactly one wins.
func TestClaimIdempotencyRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	c := newClock()
	a, b := mustOpen(t, dir, c), mustOpen(t, dir, c)
	var mu sync.Mutex
	won := 0
	var wg sync.WaitGroup
	for i := range 16 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			claim, rec, err := s.ClaimIdempotency(ctx, "alice", "tool", "k", "h", time.Minute, time.Hour)
			if err != nil || (claim == "") == (rec == nil) {
				t.Errorf("claim: %q %+v %v", claim, rec, err)
			}
			if claim != "" {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d claims won, want 1", won)
	}
}

// BenchmarkClaimIdempotency is what a call with an idempotency key adds:
// its claim, then its completion.
func BenchmarkClaimIdempotency(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	result := make([]byte, 512)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		key := fmt.Sprint("key", i)
		claim, _, err := s.ClaimIdempotency(ctx, "alice", "mcp:fs:write", key, "h", time.Minute, time.Hour)
		if err == nil {
			err = s.CompleteIdempotency(ctx, "alice", "mcp:fs:write", key, claim, result, time.Hour)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
