package testkit

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestPollWaitsForTheCondition(t *testing.T) {
	var n atomic.Int32
	if !Poll(10*time.Second, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("Poll gave up on a condition that became true")
	}
	if n.Load() != 5 {
		t.Errorf("Poll checked %d times, want 5 (it stops once the condition holds)", n.Load())
	}
}

func TestPollGivesUp(t *testing.T) {
	start := time.Now()
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Error("Poll gave up before its deadline")
	}
}
