package server

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A call's stream pauses only as a 2025-11-25 stream kept for resumes,
// for a retry up to maxPause; a paused stream ends its connection right
// after the pause's event, and the next connection (a resume) tells the
// source to go on.
func TestCallStreamPause(t *testing.T) {
	nop := func() {}
	var alone callStreams
	alone.key(randomSecret())
	if s := alone.open("sess", nop, false); s.pause(time.Second) != nil {
		t.Error("a 2025-06-18 stream paused")
	}
	s := alone.open("sess", nop, true)
	if s.pause(maxPause+time.Millisecond) != nil {
		t.Errorf("a stream paused for a retry over %v", maxPause)
	}
	s.add(map[string]string{"method": "notifications/progress"})
	back := s.pause(5 * time.Second)
	if back == nil {
		t.Fatal("the stream did not pause")
	}
	w := httptest.NewRecorder()
	if s.serve(context.Background(), w, 0, &alone) {
		t.Fatal("the paused stream was delivered to its end")
	}
	events := strings.Split(strings.TrimSpace(w.Body.String()), "\n\n")
	if len(events) != 2 || events[1] != "id: "+s.id+"-2\nretry: 5000\ndata:" {
		t.Fatalf("the connection carried %q, want the progress and then the pause", events)
	}
	select {
	case <-back:
		t.Fatal("the source was told to go on before a client came back")
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- s.serve(ctx, httptest.NewRecorder(), 2, &alone) }()
	select {
	case <-back:
	case <-time.After(30 * time.Second):
		t.Fatal("a resume did not tell the source to go on")
	}
	cancel()
	<-done
}

// A stream id names the replica holding the stream, sealed for its
// session: it opens for that session under the same secret only, and a
// changed one does not open at all.
func TestStreamIDNamesItsHolder(t *testing.T) {
	secret := randomSecret()
	var a, b, other callStreams
	a.key(secret)
	b.key(secret)
	other.key(randomSecret())
	a.replica, a.url = "a", "http://10.0.0.1:8787"
	id := a.mint("sess")
	if replica, url, ok := b.holder(id, "sess"); !ok || replica != "a" || url != "http://10.0.0.1:8787" {
		t.Fatalf("another replica reads %q as held by %q at %q (%v), want a at its URL", id, replica, url, ok)
	}
	if b.here("a", "http://10.0.0.1:8787") || !a.here("a", "http://10.0.0.1:8787") {
		t.Error("here names the wrong replica")
	}
	if _, _, ok := b.holder(id, "another"); ok {
		t.Error("a stream id opened for another session")
	}
	if _, _, ok := other.holder(id, "sess"); ok {
		t.Error("a stream id opened under another secret")
	}
	for i := len(streamPrefix); i < len(id); i++ {
		changed := []byte(id)
		changed[i] ^= 0x01
		if _, _, ok := b.holder(string(changed), "sess"); ok && string(changed) != id {
			t.Fatalf("the stream id changed at %d (%s) opened", i, changed)
		}
	}
}
