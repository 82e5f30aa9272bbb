package mcp

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
)

// heldWriter is a log whose writes wait until it is let go: a log reader
// that has stopped reading.
type heldWriter struct {
	let, entered chan struct{}
	once         sync.Once
	mu           sync.Mutex
	text         strings.Builder
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.let
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.text.Write(p)
}

func (w *heldWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.text.String()
}

// TestObserveDoesNotWaitForTheLog: a stdio server's socket refused by
// seccomp is observed while the server's syscall waits for capgate's
// answer, so observing it must not wait on anything slow: the call in
// flight has it at once, while the lines saying it and a file refused
// before it wait for a log that does not take them, and are written once
// the log does.
func TestObserveDoesNotWaitForTheLog(t *testing.T) {
	w := &heldWriter{let: make(chan struct{}), entered: make(chan struct{})}
	s := &Source{opts: Options{Name: "files", Logger: slog.New(slog.NewTextHandler(w, nil))}}
	c := s.watch(sandbox.Confinement{Guarantees: sandbox.Guarantees{
		Set: map[sandbox.Key]bool{sandbox.NoNetwork: true}, From: map[sandbox.Key]sandbox.Source{sandbox.NoNetwork: sandbox.FromDeclaration}}})
	p := s.denied.Load()
	call := p.enter(nil)
	// The audit reader's goroutine logs a file refused: its write waits.
	go p.file(sandbox.FileDenial{Blockers: "fs.read_file", Path: "/srv/notes"})
	<-w.entered
	observed := make(chan struct{})
	go func() {
		c.Observe(sandbox.NoNetwork)
		close(observed)
	}()
	// A deadline for an observer that waits on the log, not a measure.
	if !testkit.Poll(10*time.Second, func() bool {
		select {
		case <-observed:
			return true
		default:
			return false
		}
	}) {
		close(w.let)
		t.Fatal("observing the socket waited for the log")
	}
	if msg, _ := s.explain(call); !strings.Contains(msg, "the kernel refused it a socket (no_network") || !strings.Contains(msg, "reading /srv/notes") {
		t.Errorf("the call in flight: %q, want the socket and the file", msg)
	}
	close(w.let)
	testkit.WaitFor(t, 10*time.Second, "the log lines", func() bool {
		return strings.Contains(w.String(), `msg="the sandbox refused an MCP server" server=files denied="the kernel refused it a socket (no_network`) &&
			strings.Contains(w.String(), `denied="the kernel refused it reading /srv/notes`)
	})
}
