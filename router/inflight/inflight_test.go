package inflight

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestTrackerListsRunningCalls(t *testing.T) {
	var tr Tracker
	t0 := time.Now()
	a := tr.Start(Call{RequestID: "cap_a", Sub: "alice", Tool: "wipe", Started: t0.Add(time.Second)})
	b := tr.Start(Call{RequestID: "cap_b", Sub: "bob", Tool: "read", Started: t0})
	if l := tr.List(); len(l) != 2 || l[0].RequestID != "cap_b" || l[1].RequestID != "cap_a" {
		t.Fatalf("two running calls, oldest first: %+v", l)
	}
	tr.Done(b)
	tr.Done(b) // twice is harmless
	if l := tr.List(); len(l) != 1 || l[0].Sub != "alice" {
		t.Fatalf("after one ended: %+v", l)
	}
	tr.Done(a)
	if l := tr.List(); len(l) != 0 {
		t.Fatalf("after both ended: %+v", l)
	}
}

func TestNilTrackerTracksNothing(t *testing.T) {
	var tr *Tracker
	tr.Done(tr.Start(Call{Sub: "x"}))
	if l := tr.List(); l != nil {
		t.Fatalf("nil tracker lists %+v", l)
	}
}

// Calls starting and ending at once from many goroutines leave none
// behind (run with -race).
func TestTrackerConcurrent(t *testing.T) {
	var tr Tracker
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				k := tr.Start(Call{RequestID: fmt.Sprint(i, j)})
				_ = tr.List()
				tr.Done(k)
			}
		}()
	}
	wg.Wait()
	if l := tr.List(); len(l) != 0 {
		t.Fatalf("%d calls left behind", len(l))
	}
}

// BenchmarkStartDone is the tracker's cost per call, calls running in
// parallel (what every call through the router pays).
func BenchmarkStartDone(b *testing.B) {
	var tr Tracker
	c := Call{RequestID: "cap_x", Sub: "alice", Tool: "wipe", Started: time.Now()}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.Done(tr.Start(c))
		}
	})
}
