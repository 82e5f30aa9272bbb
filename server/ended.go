package server

import (
	"context"
	"sync"
	"time"
)

// A 2025-11-25 session ends when its client sends DELETE, on every
// replica: session ids are MACs any replica accepts (session.go), so the
// end is a claim in the store the replicas share ("session-ended:" and the
// id), which every request with a session id checks (one indexed read)
// and answers 404 after. An ended id stays ended for sessionEndTTL; a
// client that presents it later still gets a fresh session, as it would
// after a restart. Without a store the ends hold in this process.

const sessionEndTTL = 24 * time.Hour

// ClaimedFunc says whether a key is claimed (ClaimFunc) and the claim lives.
type ClaimedFunc func(ctx context.Context, key string) (bool, error)

type sessionEnds struct {
	claim   ClaimFunc
	claimed ClaimedFunc
	mu      sync.Mutex
	local   map[string]time.Time // with no store: id → until
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
	return e.claimed(ctx, endKey(id))
}
