package server

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// wait returns once every busy connection has left (idle or closed),
// not before, and when its context ends.
func TestInFlightWait(t *testing.T) {
	f := newInFlight()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	f.track(a, http.StateNew)
	f.track(a, http.StateActive)
	f.track(b, http.StateActive)
	done := make(chan struct{})
	go func() { f.wait(context.Background()); close(done) }()
	returned := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	// Requests come and go on a while b stays busy: wait waits.
	for range 100 {
		f.track(a, http.StateIdle)
		f.track(a, http.StateActive)
	}
	f.track(a, http.StateIdle)
	f.track(a, http.StateClosed) // closed after idle: not counted twice
	if returned() {
		t.Fatal("wait returned with a connection still busy")
	}
	f.track(b, http.StateIdle)
	testkit.WaitFor(t, 5*time.Second, "wait to return once no connection is busy", returned)

	f.track(a, http.StateActive)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.wait(ctx) // returns: its context ended
	f.track(a, http.StateHijacked)
	f.wait(context.Background()) // returns: nothing busy
}
