package router

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestCallLogLine: every call logs one "call" line naming who, which
// tool, the decision, its code and gate, how long and the request id, and
// nothing of the input or the token.
func TestCallLogLine(t *testing.T) {
	r, raw := benchRouter(t)
	var buf bytes.Buffer
	r.opts.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := r.Authenticate(raw)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, inv, err := r.Invoke(ctx, c, Request{Tool: "bench__noop", Input: json.RawMessage(`{"message":"secret-input"}`), Protocol: "bench"})
	if err != nil {
		t.Fatal(err)
	}
	_, denied, err := r.Invoke(ctx, c, Request{Tool: "bench__noop", Input: json.RawMessage(`{"message":7}`), Protocol: "bench"})
	if err == nil {
		t.Fatal("a number where the schema wants a string was accepted")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var calls []string
	for _, l := range lines {
		if strings.Contains(l, " msg=call ") {
			calls = append(calls, l)
		}
	}
	if len(calls) != 2 {
		t.Fatalf("want 2 call lines, got %d in:\n%s", len(calls), buf.String())
	}
	for i, want := range []string{
		"level=INFO msg=call sub=alice tool=bench__noop decision=allow code=\"\" gate=\"\" duration_ms=",
		"level=INFO msg=call sub=alice tool=bench__noop decision=deny code=capability_invalid_input gate=input duration_ms=",
	} {
		if !strings.HasPrefix(calls[i], "time=") || !strings.Contains(calls[i], want) {
			t.Errorf("line %d = %q, want time=… %s…", i, calls[i], want)
		}
	}
	for i, id := range []string{inv.ID, denied.ID} {
		if id == "" || !strings.HasSuffix(calls[i], " request_id="+id) {
			t.Errorf("line %d = %q, want it to end with request_id=%s", i, calls[i], id)
		}
	}
	if out := buf.String(); strings.Contains(out, "secret-input") || strings.Contains(out, raw) {
		t.Errorf("the log holds the input or the token:\n%s", out)
	}
}
