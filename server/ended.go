package server

import (
	"context"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// A 2025-11-25 session ends when its client sends DELETE, on every
// replica: session ids are MACs any replica accepts (session.go), so the
// end is a claim in the store the replicas share ("session-ended:" and the
// id), which every request with a session id checks (one indexed read,
// at most once per endRecheck per session) and answers 404 after. An ended id stays ended for sessionEndTTL; a
// client that presents it later still gets a fresh session, as it would
// after a restart. Without a store the ends hold in this process.

const sessionEndTTL = 24 * time.Hour

// endRecheck is how long a replica trusts the store's last "not ended"
// for a session, so the store is read once per session per endRecheck,
// not on every request (that read cost 55-90 µs of CPU per 2025-11-25
// call in the side-by-side bench). An end on this replica holds at once;
// one on another replica holds here within endRecheck.
const endRecheck = time.Second

// endSeen bounds the sessions remembered as not ended (a session gone
// from it is only read from the store again).
const endSeen = 8192

// ClaimedFunc says whether a key is claimed (ClaimFunc) and the claim lives.
type ClaimedFunc func(ctx context.Context, key string) (bool, error)

type sessionEnds struct {
	claim   ClaimFunc
	claimed ClaimedFunc
	mu      sync.Mutex
	local   map[string]time.Time // with no store: id → until

	seen *lru.Cache[string, time.Time] // with a store: id → when it said "not ended"
	gone *lru.Cache[string, time.Time] // with a store: id ended here → until
}

// shared makes the ends shared through the store's claims.
func (e *sessionEnds) shared(claim ClaimFunc, claimed ClaimedFunc) {
	e.claim, e.claimed = claim, claimed
	e.seen, _ = lru.New[string, time.Time](endSeen)
	e.gone, _ = lru.New[string, time.Time](endSeen)
}

func endKey(id string) string { return "session-ended:" + id }

// end records that session id ended.
func (e *sessionEnds) end(ctx context.Context, id string) error {
	until := time.Now().Add(sessionEndTTL)
	if e.claim == nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.local == nil {
			e.local = map[string]time.Time{}
		}
		e.local[id] = until
		return nil
	}
	_, err := e.claim(ctx, endKey(id), until) // already ended: ended
	if err == nil {
		e.gone.Add(id, until)
	}
	return err
}

// ended says whether session id ended; a store that cannot say is an error.
func (e *sessionEnds) ended(ctx context.Context, id string) (bool, error) {
	if e.claimed == nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		until, ok := e.local[id]
		if ok && time.Now().After(until) {
			delete(e.local, id)
			return false, nil
		}
		return ok, nil
	}
	if until, ok := e.gone.Get(id); ok && time.Now().Before(until) {
		return true, nil
	}
	if at, ok := e.seen.Get(id); ok && time.Since(at) < endRecheck {
		return false, nil
	}
	now := time.Now()
	ended, err := e.claimed(ctx, endKey(id))
	if err == nil && !ended {
		e.seen.Add(id, now)
	}
	return ended, err
}
