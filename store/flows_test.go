package store

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"sync"
	"testing"
	"time"
)

var flowIDRe = regexp.MustCompile(`^caf_[0-9a-f]{32}$`)

func TestFlowIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	const n = 1000
	seen := make(map[string]bool, n)
	var perPos [32]map[byte]bool
	for i := range perPos {
		perPos[i] = map[byte]bool{}
	}
	for range n {
		f, err := s.BeginFlow(ctx, "alice", "cap", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !flowIDRe.MatchString(f.ID) {
			t.Fatalf("flow id %q, want caf_ and 32 hex digits", f.ID)
		}
		if seen[f.ID] {
			t.Fatalf("flow id %q twice", f.ID)
		}
		seen[f.ID] = true
		for i := range 32 {
			perPos[i][f.ID[4+i]] = true
		}
	}
	// Every one of the 32 hex digits varies, as random bits do (a counter
	// or a timestamp would leave leading digits fixed).
	for i, m := range perPos {
		if len(m) < 12 {
			t.Errorf("hex digit %d took only %d values over %d ids", i, len(m), n)
		}
	}
}

func TestFlowTakenOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	state := []byte(`{"verifier":"pkce"}`)
	f, err := s.BeginFlow(ctx, "alice", "bridge:gog:email", "me@example.com", state)
	if err != nil {
		t.Fatal(err)
	}
	if !f.ExpiresAt.Equal(c.Now().Add(FlowTTL)) || !f.CreatedAt.Equal(c.Now()) {
		t.Errorf("flow times %v .. %v, want now .. now+%v", f.CreatedAt, f.ExpiresAt, FlowTTL)
	}
	got, err := s.TakeFlow(ctx, f.ID, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != f.ID || got.Sub != "alice" || got.CapabilityID != "bridge:gog:email" || got.AccountHint != "me@example.com" ||
		!bytes.Equal(got.State, state) || !got.CreatedAt.Equal(f.CreatedAt) || !got.ExpiresAt.Equal(f.ExpiresAt) {
		t.Errorf("took %+v, want %+v", got, f)
	}
	if _, err := s.TakeFlow(ctx, f.ID, "alice"); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("second take: %v, want ErrFlowInvalid", err)
	}
	if _, err := s.TakeFlow(ctx, "caf_00000000000000000000000000000000", "alice"); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("unknown flow: %v, want ErrFlowInvalid", err)
	}
	if _, err := s.BeginFlow(ctx, "", "cap", "", nil); err == nil {
		t.Error("flow with an empty sub begun")
	}
}

func TestFlowOtherSub(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	f, err := s.BeginFlow(ctx, "alice", "cap", "", []byte("s"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"bob", "", "Alice", "alice "} {
		if got, err := s.TakeFlow(ctx, f.ID, sub); !errors.Is(err, ErrFlowInvalid) {
			t.Errorf("take by %q: %+v, %v; want ErrFlowInvalid", sub, got, err)
		}
	}
	if got, err := s.TakeFlow(ctx, f.ID, "alice"); err != nil || string(got.State) != "s" {
		t.Errorf("the owner's take after others tried: %+v, %v", got, err)
	}
}

func TestFlowExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	late, err := s.BeginFlow(ctx, "alice", "cap", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	inTime, err := s.BeginFlow(ctx, "alice", "cap", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(FlowTTL - time.Second)
	if _, err := s.TakeFlow(ctx, inTime.ID, "alice"); err != nil {
		t.Errorf("take a second before expiry: %v", err)
	}
	c.Advance(2 * time.Second)
	if _, err := s.TakeFlow(ctx, late.ID, "alice"); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("take after %v: %v, want ErrFlowInvalid", FlowTTL+time.Second, err)
	}
}

func TestFlowConcurrentTakers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	for round := range 5 {
		f, err := s.BeginFlow(ctx, "alice", "cap", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		const takers = 20
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, invalid := 0, 0
		start := make(chan struct{})
		for range takers {
			wg.Go(func() {
				<-start
				_, err := s.TakeFlow(ctx, f.ID, "alice")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case errors.Is(err, ErrFlowInvalid):
					invalid++
				default:
					t.Errorf("take: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if wins != 1 || invalid != takers-1 {
			t.Errorf("round %d: %d takers won, %d got ErrFlowInvalid; want 1 and %d", round, wins, invalid, takers-1)
		}
	}
}

// TestFlowByID: a browser's link reads and its callback takes a flow by
// id alone, getting the subject that began it; taken once, within
// FlowTTL.
func TestFlowByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	f, err := s.BeginFlow(ctx, "alice", "mcp:tracker", "", []byte("st"))
	if err != nil {
		t.Fatal(err)
	}
	peek, err := s.FlowByID(ctx, f.ID)
	if err != nil || peek.Sub != "alice" || peek.CapabilityID != "mcp:tracker" || string(peek.State) != "st" {
		t.Fatalf("FlowByID = %+v, %v", peek, err)
	}
	got, err := s.TakeFlowByID(ctx, f.ID)
	if err != nil || got.Sub != "alice" || string(got.State) != "st" {
		t.Fatalf("TakeFlowByID = %+v, %v", got, err)
	}
	if _, err := s.TakeFlowByID(ctx, f.ID); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("second take: %v, want ErrFlowInvalid", err)
	}
	if _, err := s.FlowByID(ctx, f.ID); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("read after take: %v, want ErrFlowInvalid", err)
	}
	late, err := s.BeginFlow(ctx, "bob", "mcp:tracker", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(FlowTTL + time.Second)
	if _, err := s.FlowByID(ctx, late.ID); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("read after expiry: %v", err)
	}
	if _, err := s.TakeFlowByID(ctx, late.ID); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("take after expiry: %v", err)
	}
}

// TestFlowStateSealed: a flow's state is not in the operations database
// in the clear, and a row edited to name another subject does not open.
func TestFlowStateSealed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	secret := []byte(`{"verifier":"pkce-verifier-that-must-not-be-readable-0123456789"}`)
	f, err := s.BeginFlow(ctx, "alice", "mcp:tracker", "", secret)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := s.ops.QueryRowContext(ctx, `SELECT state FROM auth_flows WHERE id = ?`, f.ID).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("pkce-verifier")) || len(raw) <= len(secret) {
		t.Fatalf("the stored state is in the clear: %q", raw)
	}
	got, err := s.FlowByID(ctx, f.ID)
	if err != nil || !bytes.Equal(got.State, secret) {
		t.Fatalf("FlowByID: %q %v", got, err)
	}
	if _, err := s.ops.ExecContext(ctx, `UPDATE auth_flows SET sub = 'mallory' WHERE id = ?`, f.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeFlowByID(ctx, f.ID); !errors.Is(err, ErrFlowInvalid) {
		t.Errorf("a flow moved to another subject: %v, want ErrFlowInvalid", err)
	}
}
