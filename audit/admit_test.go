package audit

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// TestAdmitDiskFull fills the disk under a real Log on a tmpfs and keeps
// admitting calls: each admitted call logs its records after it was
// admitted, some after the log turned unhealthy, and every one of them
// lands in the space reserved ahead, with the disk still full. Admit
// refuses once that space is promised, with the disk's error.
func TestAdmitDiskFull(t *testing.T) {
	dir := tmpfs(t, "1m")
	path := filepath.Join(dir, "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: 5 * time.Millisecond, Reserve: 64 << 10})
	defer l.Close()
	l.Log(fullEvent(TypeToolCall, 0))
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(dir, "filler"))
	// Calls admitted and still running when the log turns unhealthy.
	var running []Ticket
	admitted := 0
	for {
		tk, err := l.Admit()
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Admit with the disk full: %v, want ENOSPC", err)
			}
			break
		}
		admitted++
		e := fullEvent(TypeCapabilityCheck, admitted)
		tk.Log(&e)
		if admitted%2 == 0 {
			running = append(running, tk) // its tool_call comes later
			continue
		}
		e = fullEvent(TypeToolCall, admitted)
		tk.Log(&e)
		tk.Done()
		if admitted > 10000 {
			t.Fatal("Admit never refused with the disk full")
		}
	}
	if l.Healthy() == nil {
		t.Fatal("Admit refused, Healthy() is nil")
	}
	// Events no ticket covers take what reserved space is left, then
	// are counted, not queued: they cannot take the space promised to
	// the calls still running.
	queued := 0
	for l.Unrecorded() == 0 {
		l.Log(fullEvent(TypeCapabilityCheck, -1))
		if queued++; queued > 1000 {
			t.Fatal("events queued without end on an unhealthy log with its disk full")
		}
	}
	queued--
	for i := range running {
		e := fullEvent(TypeToolCall, 2*(i+1))
		running[i].Log(&e)
		running[i].Done()
	}
	want := 1 + 2*admitted + queued
	var lines int
	if !testkit.Poll(5*time.Second, func() bool {
		l.Flush()
		rep, err := VerifyFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines = rep.Lines
		return lines == want
	}) {
		t.Fatalf("with the disk full: %d lines, want %d (%d calls admitted)", lines, want, admitted)
	}
	t.Logf("%d calls admitted with the disk full, %d more events queued", admitted, queued)
}

// TestRecordBounded: a record's fields are cut so that it fits the space
// a Ticket promises for it, however long the caller's words were.
func TestRecordBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// Reserve enough that, uncut, the records would fit: the test then
	// fails on their length rather than waiting for space.
	l := openT(t, path, Options{Reserve: 32 << 20})
	e := fullEvent(TypeToolCall, 1)
	e.ToolName = strings.Repeat("\x01", 1<<20) // 6 bytes each, escaped
	e.Detail = strings.Repeat("é", 1<<16)
	e.Guarantees = `{"secrets_allowed":["` + strings.Repeat("A", 1<<12) + `"]}`
	tk, err := l.Admit()
	if err != nil {
		t.Fatal(err)
	}
	for range CallRecords {
		tk.Log(&e)
	}
	if tk.left < 0 {
		t.Errorf("ticket overdrawn: %d", tk.left)
	}
	tk.Done()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	if len(lines) != CallRecords {
		t.Fatalf("%d lines", len(lines))
	}
	for _, line := range lines {
		if len(line) > recordCost || !strings.Contains(line, `…"`) {
			t.Errorf("line of %d bytes, want at most %d, cut with …: %.200s", len(line), recordCost, line)
		}
		// guarantees is a JSON value: cut, it says so and stays JSON.
		if !json.Valid([]byte(line)) || !strings.Contains(line, `"guarantees":{"cut":4120}`) {
			t.Errorf("guarantees not cut to valid JSON: %.200s", line)
		}
	}
}
