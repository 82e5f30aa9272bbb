package logbuf

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// sink is the underlying writer: it records each write(2) it would be.
type sink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.buf.Write(p)
}

func (s *sink) get() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String(), s.writes
}

func TestLoneLineAtOnceBurstGathered(t *testing.T) {
	s := &sink{}
	b := New(s, time.Hour)
	b.Write([]byte("one\n"))
	if got, n := s.get(); got != "one\n" || n != 1 {
		t.Fatalf("after a quiet spell: %q in %d writes, want the line at once", got, n)
	}
	for i := range 100 {
		fmt.Fprintf(b, "line %d\n", i)
	}
	if got, _ := s.get(); got != "one\n" {
		t.Fatalf("a burst within the window was written line by line: %q", got)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	got, n := s.get()
	if n != 2 || !strings.HasSuffix(got, "line 99\n") || strings.Count(got, "\n") != 101 {
		t.Fatalf("after Flush: %d writes, %d lines", n, strings.Count(got, "\n"))
	}
}

// Gathered lines go out when the window ends, with no Flush; lines from
// many goroutines stay whole, each once.
func TestGatheredLinesFollowWithoutFlush(t *testing.T) {
	s := &sink{}
	b := New(s, 20*time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				fmt.Fprintf(b, "g%d line %d\n", g, i)
			}
		})
	}
	wg.Wait()
	testkit.WaitFor(t, 10*time.Second, "every line written", func() bool {
		got, _ := s.get()
		return strings.Count(got, "\n") == 1600
	})
	got, n := s.get()
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if seen[l] || !strings.HasPrefix(l, "g") {
			t.Fatalf("line %q twice or torn", l)
		}
		seen[l] = true
	}
	if n >= 1600 {
		t.Errorf("%d writes for 1600 lines: nothing was gathered", n)
	}
}

// TestUrgentWrittenAtOnce: within a window (an hour here), info lines are
// gathered, and a warning goes out at once with the lines before it.
func TestUrgentWrittenAtOnce(t *testing.T) {
	s := &sink{}
	b := New(s, time.Hour)
	log := slog.New(Urgent(slog.NewTextHandler(b, nil), b, slog.LevelWarn)).With("sub", "x")
	log.Info("first")  // after a quiet spell: at once
	log.Info("second") // gathered
	if got, _ := s.get(); strings.Contains(got, "second") {
		t.Fatalf("an info line in the window was written at once: %q", got)
	}
	log.WithGroup("g").Warn("refused", "why", "w")
	got, n := s.get()
	if n != 2 || !strings.Contains(got, "msg=second") || !strings.Contains(got, "msg=refused sub=x g.why=w") {
		t.Fatalf("after a warning: %d writes: %q, want the warning and the line before it out", n, got)
	}
}

// BenchmarkWriteGathered is serve's log under load: lines gathered while
// a flush is due, 50 to a flush (a 100 ms window at 500 calls a second).
func BenchmarkWriteGathered(b *testing.B) {
	w := New(discard{}, time.Hour)
	line := []byte("time=2026-11-27T13:52:31.786Z level=INFO msg=call sub=bench tool=echo decision=allow code=\"\" gate=\"\" duration_ms=0.742 request_id=cap_8bd9c1e40f5aa4169b8272c8\n")
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if n++; n%50 == 0 {
			w.Flush()
		}
		w.Write(line)
	}
	w.Flush()
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
