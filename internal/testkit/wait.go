package testkit

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds and fails tb naming what if it does not
// within timeout. Tests wait for a condition with it, never for a fixed time:
// a fixed sleep is too short under load and too long otherwise. It polls
// quickly at first (1 ms, doubling up to 50 ms), so a condition that is soon
// true costs little.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, cond) {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Poll is WaitFor that reports whether cond held within timeout instead of
// failing, for a test that says more about what it saw.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
	return true
}
