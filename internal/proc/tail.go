package proc

import (
	"strings"
	"sync"

	"github.com/capgate/capgate/harden"
)

// ReportTail is how much of a process's stderr a start failure shows to
// callers and in tools list: its last lines, at most this many bytes.
const ReportTail = 512

// Reported is stderr fit to show beside a start failure: its last lines
// (ReportTail bytes at most), each line in which output hardening finds a
// credential replaced by what it found, never the value.
func Reported(stderr string) string {
	s := strings.TrimSpace(stderr)
	if len(s) > ReportTail {
		s = s[len(s)-ReportTail:]
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if f, ok := harden.Message(l); ok {
			lines[i] = "[a line withheld: it holds " + f + "]"
		}
	}
	return strings.Join(lines, "\n")
}

// Tail keeps the last StderrTail bytes written to it, safe to read while
// a process still writes (a long-lived server's stderr).
type Tail struct {
	mu sync.Mutex
	t  tail
}

func (t *Tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t.max == 0 {
		t.t.max = StderrTail
	}
	return t.t.Write(b)
}

// String is what was kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.t.buf)
}
