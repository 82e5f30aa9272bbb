package main

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// flushWatch records what a streamable HTTP response has flushed, so that a
// tool can wait until its notifications have left the server before it
// returns. The suite's client loses a progress notification that arrives in
// the same read as the response (see settle); a fixed pause alone is not
// enough when a loaded machine delays the forwarder that writes it.
//
// On a 2025-11-25 session a call's notification may leave on the session's
// standalone GET stream instead of the call's own: mcp-go v1.2.1 feeds both
// from one queue (server/streamable_http.go:819, the POST's forwarder, and
// server/streamable_http_resume.go:308, the GET stream's pump), so a wait
// looks at every response of the session.
type flushWatch struct {
	http.ResponseWriter
	session string // the request's Mcp-Session-Id

	mu      sync.Mutex
	written []byte // everything written; responses here are small
	flushed int    // how much of written has been flushed
}

type flushWatchKey struct{}

// watches are the responses being written now, and flushes is closed (and
// replaced) on every flush of any of them.
var watches = struct {
	mu      sync.Mutex
	live    map[*flushWatch]bool
	flushes chan struct{}
}{live: map[*flushWatch]bool{}, flushes: make(chan struct{})}

// watchFlushes hands every request's handler a flushWatch through its context.
func watchFlushes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw := &flushWatch{ResponseWriter: w, session: r.Header.Get(server.HeaderKeySessionID)}
		watches.mu.Lock()
		watches.live[fw] = true
		watches.mu.Unlock()
		defer func() {
			watches.mu.Lock()
			delete(watches.live, fw)
			watches.mu.Unlock()
		}()
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
	fw.mu.Unlock()
	watches.mu.Lock()
	close(watches.flushes)
	watches.flushes = make(chan struct{})
	watches.mu.Unlock()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (fw *flushWatch) Unwrap() http.ResponseWriter { return fw.ResponseWriter }

// has says whether fw has flushed bytes containing marker.
func (fw *flushWatch) has(marker []byte) bool {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return bytes.Contains(fw.written[:fw.flushed], marker)
}

// awaitFlushed waits until the response that ctx belongs to, or another
// response of its session (a 2025-11-25 session's GET stream), has flushed
// bytes containing marker, for at most five seconds (a notification that
// never leaves is the server's failure to show, not a reason to hang). It
// returns at once when ctx carries no flushWatch (stdio), and false when
// ctx ends first.
func awaitFlushed(ctx context.Context, marker string) bool {
	fw, _ := ctx.Value(flushWatchKey{}).(*flushWatch)
	if fw == nil {
		return true
	}
	m := []byte(marker)
	limit := time.NewTimer(5 * time.Second)
	defer limit.Stop()
	for {
		watches.mu.Lock()
		flushes := watches.flushes
		var others []*flushWatch
		if fw.session != "" {
			for w := range watches.live {
				if w != fw && w.session == fw.session {
					others = append(others, w)
				}
			}
		}
		watches.mu.Unlock()
		done := fw.has(m)
		for _, w := range others {
			done = done || w.has(m)
		}
		if done {
			return true
		}
		select {
		case <-flushes:
		case <-limit.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
}
