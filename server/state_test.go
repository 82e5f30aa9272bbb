package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capgate/capgate/tool"
)

// A sealed state opens only unchanged, under the same secret, for its
// subject, before its expiry; it is claimed once.
func TestStateSealed(t *testing.T) {
	s := newStateSealer([]byte("secret one"), "r1", "http://10.0.0.1:8787", nil)
	now := time.Now()
	st := &requestState{ID: "job_1", Sub: "alice", Exp: now.Add(time.Minute).UnixMilli(), Replica: "r1"}
	raw, err := s.seal(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.open(raw, "alice", now)
	if err != nil || got.ID != "job_1" || got.Replica != "r1" || got.Use == "" {
		t.Fatalf("open = %+v, %v", got, err)
	}
	if twin, err := newStateSealer([]byte("secret one"), "r2", "", nil).open(raw, "alice", now); err != nil || twin.Use != got.Use {
		t.Errorf("another replica with the same secret: %+v, %v", twin, err)
	}
	for i := len(statePrefix); i < len(raw); i++ {
		c := byte('A')
		if raw[i] == 'A' {
			c = 'B'
		}
		if _, err := s.open(raw[:i]+string(c)+raw[i+1:], "alice", now); !errors.Is(err, errStateInvalid) {
			t.Fatalf("changing byte %d: %v", i, err)
		}
	}
	refused := map[string]struct {
		s        *stateSealer
		raw, sub string
		at       time.Time
		want     error
	}{
		"another secret":  {newStateSealer([]byte("secret two"), "r1", "", nil), raw, "alice", now, errStateInvalid},
		"another subject": {s, raw, "bob", now, errStateExpired},
		"expired":         {s, raw, "alice", now.Add(time.Minute), errStateExpired},
		"no prefix":       {s, raw[len(statePrefix):], "alice", now, errStateInvalid},
		"truncated":       {s, raw[:len(statePrefix)+8], "alice", now, errStateInvalid},
	}
	for name, tc := range refused {
		if _, err := tc.s.open(tc.raw, tc.sub, tc.at); err != tc.want || tool.ErrorCode(err) != tool.CodeInvalidInput {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	ctx := context.Background()
	if err := s.use(ctx, got); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if err := s.use(ctx, got); err != errStateUsed {
		t.Errorf("second use: %v, want %v", err, errStateUsed)
	}
	// A store that cannot answer fails closed.
	down := newStateSealer([]byte("secret one"), "r1", "", func(context.Context, string, time.Time) (bool, error) {
		return false, errors.New("database is locked")
	})
	if err := down.use(ctx, got); tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Errorf("use with the store down: %v", err)
	}
}
