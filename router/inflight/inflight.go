// Package inflight keeps the calls a replica is running now (held for an
// approval, or running their tool), for the console's live page. A
// tracker outlives router rebuilds on reload, so that calls started
// before a reload are still listed until they end.
package inflight

import (
	"slices"
	"sync"
	"time"
)

// Call is one call running now.
type Call struct {
	RequestID string // the audit's request_id of the call
	Sub       string
	Tool      string // as the caller named it
	Protocol  string
	Started   time.Time
}

// Tracker is the set of calls running now. The zero value is ready; a nil
// *Tracker tracks nothing. It is safe for concurrent use.
type Tracker struct {
	mu    sync.Mutex
	next  uint64
	calls map[uint64]Call
}

// Start adds a call and returns the ticket Done takes when it ends.
func (t *Tracker) Start(c Call) uint64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.calls == nil {
		t.calls = map[uint64]Call{}
	}
	t.next++
	t.calls[t.next] = c
	return t.next
}

// Done removes the call Start gave ticket for.
func (t *Tracker) Done(ticket uint64) {
	if t == nil || ticket == 0 {
		return
	}
	t.mu.Lock()
	delete(t.calls, ticket)
	t.mu.Unlock()
}

// List returns the calls running now, oldest first.
func (t *Tracker) List() []Call {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	out := make([]Call, 0, len(t.calls))
	for _, c := range t.calls {
		out = append(out, c)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Call) int { return a.Started.Compare(b.Started) })
	return out
}
