package main

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"time"
)

// flushWatch records what a streamable HTTP response has flushed, so that a
// tool can wait until its last notification has left the server before it
// returns. The suite's client loses a progress notification that arrives in
// the same read as the response (see settle); a fixed pause alone is not
// enough when a loaded machine delays the forwarder that writes it.
type flushWatch struct {
	http.ResponseWriter

	mu      sync.Mutex
	written []byte        // everything written; responses here are small
	flushed int           // how much of written has been flushed
	changed chan struct{} // closed and replaced on every flush
}

type flushWatchKey struct{}

// watchFlushes hands every request's handler a flushWatch through its context.
func watchFlushes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw := &flushWatch{ResponseWriter: w, changed: make(chan struct{})}
		h.ServeHTTP(fw, r.WithContext(context.WithValue(r.Context(), flushWatchKey{}, fw)))
	})
}

func (fw *flushWatch) Write(p []byte) (int, error) {
	fw.mu.Lock()
	fw.written = append(fw.written, p...)
	fw.mu.Unlock()
	return fw.ResponseWriter.Write(p)
}

func (fw *flushWatch) Flush() {
	if f, ok := fw.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	fw.mu.Lock()
	fw.flushed = len(fw.written)
	close(fw.changed)
	fw.changed = make(chan struct{})
	fw.mu.Unlock()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (fw *flushWatch) Unwrap() http.ResponseWriter { return fw.ResponseWriter }

// awaitFlushed waits until the response that ctx belongs to has flushed bytes
// containing marker, for at most five seconds (a notification that never
// leaves is the server's failure to show, not a reason to hang). It returns
// at once when ctx carries no flushWatch (stdio), and false when ctx ends
// first.
func awaitFlushed(ctx context.Context, marker string) bool {
	fw, _ := ctx.Value(flushWatchKey{}).(*flushWatch)
	if fw == nil {
		return true
	}
	limit := time.NewTimer(5 * time.Second)
	defer limit.Stop()
	for {
		fw.mu.Lock()
		done := bytes.Contains(fw.written[:fw.flushed], []byte(marker))
		changed := fw.changed
		fw.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-limit.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
}
