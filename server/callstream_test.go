package server

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A call's stream pauses only as a 2025-11-25 stream kept for resumes, on
// a replica alone, for a retry up to maxPause; a paused stream ends its
// connection right after the pause's event, and the next connection (a
// resume) tells the source to go on.
func TestCallStreamPause(t *testing.T) {
	nop := func() {}
	var alone, replicas callStreams
	replicas.replicas = true
	if s := alone.open("sess", nop, false); s.pause(time.Second) != nil {
		t.Error("a 2025-06-18 stream paused")
	}
	if s := replicas.open("sess", nop, true); s.pause(time.Second) != nil {
		t.Error("a replica with others paused its stream")
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
