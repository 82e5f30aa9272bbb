package server

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// A call's stream: the SSE response of one tools/call in a 2025-11-25 (or
// 2025-06-18) session, written by capgate (streamcall.go says which calls).
// Every event carries an id, "<stream>-<n>"; a client whose connection
// broke comes back with GET and Last-Event-ID and gets what followed, then
// the rest live (SEP-1699). The events are kept in the memory of the
// replica the call runs on (its job, its upstream connection), so the live
// tail can only come from there, and storing every progress notification
// of every call in the shared store would cost a write each for the rare
// resume. The stream id says which replica that is: it is sealed
// (AES-256-GCM under a key derived from the shared secret) over the
// holder's replica id and internal URL, bound to the session, so a client
// can neither read it, nor make one naming another address, nor use it
// from another session. A resume that reaches another replica is
// forwarded to the holder over the authenticated internal call
// (internal.go), and the holder's answer relayed as it comes.
//
// An upstream may close its stream of a call mid-way asking to be resumed
// after a retry delay (SSE polling, SEP-1699). capgate then closes its
// client's stream the same way (pause): an event of its own with the
// upstream's retry, then the end of the connection. When the client
// comes back with Last-Event-ID, on any replica, the source resumes the
// upstream's stream at once, so the upstream sees its client's timing as
// if capgate were not there; a client that does not come back within the
// retry is not waited for (the source resumes by itself and this stream
// keeps what follows for the client's resume).

const (
	// streamRetry is the reconnection delay the priming event asks for.
	streamRetry = time.Second
	// resumeKeep: a stream whose end was not delivered is kept this long
	// after it, for a resume.
	resumeKeep = 5 * time.Minute
	// maxStreamBytes bounds what one stream keeps for a resume; the oldest
	// events go first (a resume from before them is refused).
	maxStreamBytes = 4 << 20
	// maxStreams bounds the streams kept on a replica; beyond, a new
	// call's stream works but cannot be resumed.
	maxStreams = 4096
	// streamPrefix starts every stream id: a Last-Event-ID that does not
	// is not capgate's.
	streamPrefix = "cgs_"
	// streamLabel separates the key sealing stream ids from the others.
	streamLabel = "capgate stream id v1"
	// maxPause: an upstream's retry longer than this is not passed on
	// (the source waits it out with the client's stream open), so that
	// a call whose client is gone is not kept for as long as an upstream
	// asks.
	maxPause = 30 * time.Second
)

// resumeWait: a call whose client is gone and has not resumed within
// this is cancelled (a broken connection is not a cancellation, but nobody
// may be coming back). A variable for tests.
var resumeWait = 30 * time.Second

// callStream is one call's events, written or to write, and the
// connection (the POST, or a resume) writing them now.
type callStream struct {
	id, session string
	cancel      context.CancelFunc // ends the call

	mu      sync.Mutex
	events  [][]byte      // whole SSE events; events[i] is number first+i
	first   int           // the number of events[0] (events are numbered from 1)
	size    int           // bytes in events
	done    bool          // the last of events is the call's response
	polls   bool          // it may be paused: a 2025-11-25 stream kept for resumes
	paused  int           // the number of the pause's retry event, 0: not paused
	retry   time.Duration // the pause's retry
	back    chan struct{} // closed when a client comes back after the pause
	conn    uint64        // the attached connection's number, 0: none
	conns   uint64        // connections attached so far
	changed chan struct{} // closed (and replaced) at every change
	gone    *time.Timer   // runs out resumeWait after the client left
}

type callStreams struct {
	mu sync.Mutex
	m  map[string]*callStream
	// aead seals stream ids; replica and url name this replica in them
	// (Options.ReplicaID, AdvertiseURL).
	aead         cipher.AEAD
	replica, url string
}

// key keys the stream ids from secret.
func (cs *callStreams) key(secret []byte) { cs.aead = sealKey(secret, streamLabel) }

// mint is a new stream id for session, naming this replica: a random
// nonce, and the replica's URL and id sealed under it with the session as
// additional data.
func (cs *callStreams) mint(session string) string {
	plain := cs.url + "\n" + cs.replica // a URL has no newline
	n := cs.aead.NonceSize()
	b := make([]byte, n, n+len(plain)+cs.aead.Overhead())
	rand.Read(b)
	b = cs.aead.Seal(b, b, []byte(plain), []byte(session))
	return streamPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// holder is the replica holding stream, by its id and URL; ok is false
// for a stream id that is not one this secret sealed for session (forged,
// changed, or another session's).
func (cs *callStreams) holder(stream, session string) (replica, url string, ok bool) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(strings.TrimPrefix(stream, streamPrefix))
	n := cs.aead.NonceSize()
	if err != nil || len(b) < n {
		return "", "", false
	}
	plain, err := cs.aead.Open(nil, b[:n], b[n:], []byte(session))
	if err != nil {
		return "", "", false
	}
	url, replica, ok = strings.Cut(string(plain), "\n")
	return replica, url, ok
}

// here says whether the replica a stream id names is this one.
func (cs *callStreams) here(replica, url string) bool { return replica == cs.replica && url == cs.url }

// open makes a stream for a call in session, kept for resumes when there
// is room; a kept one may be paused when polls is set.
func (cs *callStreams) open(session string, cancel context.CancelFunc, polls bool) *callStream {
	s := &callStream{id: cs.mint(session), session: session, cancel: cancel,
		first: 1, changed: make(chan struct{})}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[string]*callStream{}
	}
	if len(cs.m) < maxStreams {
		cs.m[s.id] = s
		s.polls = polls
	}
	return s
}

func (cs *callStreams) get(id string) *callStream {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.m[id]
}

func (cs *callStreams) drop(s *callStream) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m[s.id] == s {
		delete(cs.m, s.id)
	}
}

// add appends message as the stream's next event.
func (s *callStream) add(message any) { s.push(message, false) }

// finish appends the call's response, the stream's last event.
func (s *callStream) finish(message any) { s.push(message, true) }

func (s *callStream) push(message any, last bool) {
	data, err := json.Marshal(message)
	if err != nil {
		return // mcp-go's own types: cannot happen
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	ev := make([]byte, 0, len(data)+len(s.id)+40)
	ev = s.appendID(ev)
	ev = append(ev, "\nevent: message\ndata: "...)
	ev = append(ev, data...)
	ev = append(ev, "\n\n"...)
	s.append(ev)
	if last {
		s.done = true
		if s.gone != nil {
			s.gone.Stop()
		}
	}
	s.wake()
}

// appendID appends "id: " and the id of the next event to b; s.mu is held.
func (s *callStream) appendID(b []byte) []byte {
	b = append(b, "id: "...)
	b = append(b, s.id...)
	b = append(b, '-')
	return strconv.AppendInt(b, int64(s.first+len(s.events)), 10)
}

// append keeps ev as the next event, the oldest going beyond
// maxStreamBytes; s.mu is held.
func (s *callStream) append(ev []byte) {
	s.events = append(s.events, ev)
	s.size += len(ev)
	for s.size > maxStreamBytes && len(s.events) > 1 {
		s.size -= len(s.events[0])
		s.events[0] = nil
		s.events = s.events[1:]
		s.first++
	}
}

// pause closes the client's connection after what is queued, with an
// event asking it to come back after retry (tool.Pause). The channel is
// closed when a client comes back; nil when the stream cannot pause: not
// 2025-11-25, not kept for resumes, ended, or a retry beyond maxPause.
func (s *callStream) pause(retry time.Duration) <-chan struct{} {
	if !s.polls || retry < 0 || retry > maxPause {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil
	}
	s.paused = s.first + len(s.events)
	ev := s.appendID(nil)
	ev = append(ev, "\nretry: "...)
	ev = strconv.AppendInt(ev, retry.Milliseconds(), 10)
	ev = append(ev, "\ndata:\n\n"...)
	s.append(ev)
	s.retry = retry
	if s.back != nil {
		close(s.back) // an earlier pause nobody came back from
	}
	s.back = make(chan struct{})
	s.wake()
	return s.back
}

// wake tells the attached connection something changed; s.mu is held.
func (s *callStream) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// primingEvent is the event a 2025-11-25 stream starts with: an id to
// resume from before any other event, and how long to wait before.
func (s *callStream) primingEvent() []byte {
	return []byte("id: " + s.id + "-0\nretry: " + strconv.FormatInt(streamRetry.Milliseconds(), 10) + "\ndata:\n\n")
}

// serve writes the stream's events after number after to w until the
// last, and says whether it wrote it. It ends early when ctx ends (the
// client left) or another connection takes the stream over.
func (s *callStream) serve(ctx context.Context, w http.ResponseWriter, after int, streams *callStreams) bool {
	rc := http.NewResponseController(w)
	s.mu.Lock()
	s.conns++
	me := s.conns
	s.conn = me
	if s.gone != nil {
		s.gone.Stop()
	}
	if me > 1 && s.back != nil {
		// A client came back: the source resumes the upstream now.
		close(s.back)
		s.back, s.paused = nil, 0
	}
	s.wake() // a connection attached before gives way
	s.mu.Unlock()
	complete := false
	defer func() { s.detach(me, complete, streams) }()
	next := after + 1
	for {
		s.mu.Lock()
		if s.conn != me {
			s.mu.Unlock()
			return false
		}
		var batch [][]byte
		if i := next - s.first; i >= 0 && i < len(s.events) {
			batch = s.events[i:len(s.events):len(s.events)]
		}
		done, end, changed, paused := s.done, s.first+len(s.events), s.changed, s.paused
		s.mu.Unlock()
		for _, ev := range batch {
			if _, err := w.Write(ev); err != nil {
				return false
			}
		}
		next += len(batch)
		if len(batch) > 0 {
			if err := rc.Flush(); err != nil {
				return false
			}
		}
		if done && next >= end {
			complete = true
			return true
		}
		if paused != 0 && next-1 == paused && next >= end {
			return false // paused: the client comes back after the retry
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// detach lets connection me go. A stream delivered to its end is dropped;
// one whose call still runs cancels it if nobody resumes within
// resumeWait; one that ended undelivered is kept for resumeKeep.
func (s *callStream) detach(me uint64, complete bool, streams *callStreams) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != me {
		return
	}
	s.conn = 0
	switch {
	case complete:
		streams.drop(s)
	case !s.done:
		wait := resumeWait
		if s.paused != 0 {
			wait += s.retry // the client was told to wait that long first
		}
		s.gone = time.AfterFunc(wait, func() {
			s.mu.Lock()
			idle := s.conn == 0
			s.mu.Unlock()
			if idle {
				s.cancel()
			}
		})
	default:
		time.AfterFunc(resumeKeep, func() { streams.drop(s) })
	}
}

// parseEventID reads a Last-Event-ID of capgate's: the stream and the number of
// the last event the client has; ok is false for an id that is not
// capgate's.
func parseEventID(id string) (stream string, n int, ok bool) {
	if !strings.HasPrefix(id, streamPrefix) {
		return "", 0, false
	}
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 0 {
		return "", 0, false
	}
	return id[:i], n, true
}

// resumeStream serves a GET with Last-Event-ID for one of capgate's call
// streams: what followed that event, then the rest live, from this
// replica or relayed from the one holding the stream. It says whether
// the id was capgate's (then it answered: 404 for a stream that is not
// the session's or no longer kept).
func (m *MCP) resumeStream(w http.ResponseWriter, r *http.Request, lastEventID string) bool {
	id, _, ok := parseEventID(lastEventID)
	if !ok || r.Header.Get(mcp.HeaderProtocolVersion) == modernProtocol {
		return false // 2026-07-28 has no resumable streams: mcp-go refuses
	}
	session := r.Header.Get("Mcp-Session-Id")
	replica, url, ok := m.streams.holder(id, session)
	switch {
	case !ok:
		noStream(w, lastEventID)
	case m.streams.here(replica, url):
		m.serveResume(w, r, session, lastEventID)
	default:
		m.forwardResume(w, r, replica, url, session, lastEventID)
	}
	return true
}

// serveResume is resumeStream for a stream of this replica's.
func (m *MCP) serveResume(w http.ResponseWriter, r *http.Request, session, lastEventID string) {
	id, n, ok := parseEventID(lastEventID)
	var s *callStream
	if ok {
		s = m.streams.get(id)
	}
	if s != nil {
		s.mu.Lock()
		// What followed is no longer kept, or the id was never sent.
		lost := n+1 < s.first || n > s.first+len(s.events)-1
		s.mu.Unlock()
		if lost {
			s = nil
		}
	}
	if s == nil || s.session != session {
		noStream(w, lastEventID)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	s.serve(r.Context(), w, n, &m.streams)
}

// noStream answers a resume whose stream is unknown, the same for every
// reason (not the session's, never sent, ended, expired).
func noStream(w http.ResponseWriter, lastEventID string) {
	http.Error(w, "404 not found: no stream to resume from event "+strconv.Quote(lastEventID)+
		" (it ended, expired, or is not this session's)", http.StatusNotFound)
}
