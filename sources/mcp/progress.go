package mcp

import (
	"math"
	"sync"
)

// progressMerge joins the progress of one tools/call that reaches capgate on
// two streams of a 2025-11-25 streamable-HTTP session: the call's own (its
// POST) and the session's standalone GET stream.
//
// An mcp-go server (v1.2.1) feeds both from one queue of the session: the
// POST's forwarder (server/streamable_http.go:819) and the GET stream's
// reader (server/streamable_http_resume.go:308 with an event store, :1140
// without) each take whichever notification comes next and write it to their
// own connection, in parallel. So one call's notifications are split between
// the two streams, and the order between the streams is lost before capgate
// reads a byte; a client that holds a GET stream gets them out of order even
// directly. Each stream keeps the upstream's order, and progress MUST
// increase, so a notification lower than one already relayed from the other
// stream was overtaken on the way. It cannot be put back in its place (once a
// later one has gone to the caller, nothing says whether or when an earlier
// one is still coming, so holding notifications back would be a guess), and
// relaying it would show the caller progress going back: it is dropped.
// Within one stream everything passes as the upstream sent it, so an
// upstream that only ever uses the call's stream is relayed unchanged.
type progressMerge struct {
	mu    sync.Mutex
	relay func(progress, total float64, message string)
	top   [2]float64 // the highest progress relayed from each stream (-Inf: none yet)
	drops int        // overtaken notifications dropped
}

// The two streams a call's progress comes on.
const (
	onCall = iota
	onStandalone
)

func newProgressMerge(relay func(progress, total float64, message string)) *progressMerge {
	return &progressMerge{relay: relay, top: [2]float64{math.Inf(-1), math.Inf(-1)}}
}

// fromCall and fromStandalone relay one progress notification that came on
// the call's stream and on the standalone one.
func (m *progressMerge) fromCall(progress, total float64, message string) {
	m.add(onCall, progress, total, message)
}

func (m *progressMerge) fromStandalone(progress, total float64, message string) {
	m.add(onStandalone, progress, total, message)
}

func (m *progressMerge) add(stream int, progress, total float64, message string) {
	m.mu.Lock()
	defer m.mu.Unlock() // held while relaying: the caller gets them in the order decided here
	if progress < m.top[1-stream] {
		m.drops++
		return
	}
	m.top[stream] = max(m.top[stream], progress)
	m.relay(progress, total, message)
}

// dropped is how many overtaken notifications were dropped.
func (m *progressMerge) dropped() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.drops
}
