package server

import (
	"context"
	"net"
	"net/http"
	"sync"
)

// inFlight counts the connections that are reading or answering a
// request (net/http's StateNew and StateActive), as http.Server.ConnState
// reports them: a connection leaves it once its answer is written and
// flushed, or it is closed.
type inFlight struct {
	mu   sync.Mutex
	busy map[net.Conn]bool
	// changed is closed when one leaves, and then dropped: made only
	// for a waiter, not once per request.
	changed chan struct{}
}

func newInFlight() *inFlight {
	return &inFlight{busy: map[net.Conn]bool{}}
}

// track is the servers' ConnState; a nil f counts nothing.
func (f *inFlight) track(c net.Conn, st http.ConnState) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch st {
	case http.StateNew, http.StateActive:
		f.busy[c] = true
	default: // idle, hijacked (its handler's now, not the server's), closed
		if f.busy[c] {
			delete(f.busy, c)
			if f.changed != nil {
				close(f.changed)
				f.changed = nil
			}
		}
	}
}

// wait returns once no connection is busy, or when ctx ends.
func (f *inFlight) wait(ctx context.Context) {
	for {
		f.mu.Lock()
		n := len(f.busy)
		if n > 0 && f.changed == nil {
			f.changed = make(chan struct{})
		}
		changed := f.changed
		f.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}
