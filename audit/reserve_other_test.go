//go:build !linux || capgate_noreserve

package audit

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestNoReserve: where nothing can be reserved (every OS but Linux), a
// Log with a reserve asked for holds none, says it is healthy, admits
// calls without a budget, and writes every record into a chain that
// verifies. Run on Linux with -tags capgate_noreserve.
func TestNoReserve(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: 5 * time.Millisecond, Reserve: 64 << 10})
	if err := l.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v, want nil: no reserve is not a sick log", err)
	}
	// Far more calls than 64 KiB of reserve would admit at once, none
	// done: a bounded budget would block here.
	const calls = 200
	var tickets []Ticket
	for i := range calls {
		tk, err := l.Admit()
		if err != nil {
			t.Fatalf("Admit %d: %v", i, err)
		}
		e := fullEvent(TypeToolCall, i)
		tk.Log(&e)
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets {
		tk.Done()
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lines != calls {
		t.Fatalf("verified %d lines, want %d", rep.Lines, calls)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() == 0 {
		t.Fatal("empty log")
	}
}
