package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/tool"
)

// TestCallRelaysRequestsAndLogs calls the conformance fixture's tools
// over streamable HTTP, on both protocols: its sampling and elicitation
// requests reach the call's Ask and the answers go back; its log messages
// reach the call's Log when they come on the call's stream; what names no
// call reaches nobody. On 2026-07-28 every request is an input round of
// its own call, so sampling reaches it too.
func TestCallRelaysRequestsAndLogs(t *testing.T) {
	url := conformance.StartFixture(t)
	for _, protocol := range []string{Protocol, ""} {
		t.Run("protocol="+protocol, func(t *testing.T) { testCallRelays(t, url, protocol) })
	}
}

func testCallRelays(t *testing.T, url, protocol string) {
	s := connect(t, Options{Name: "fx", URL: url, Protocol: protocol, Timeout: 10 * time.Second})
	modern := protocol == ""
	if got := s.conn.modern(); got != modern {
		t.Fatalf("speaks 2026-07-28: %v, want %v", got, modern)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ds, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*tool.Descriptor{}
	for _, d := range ds {
		byName[d.Name] = d
	}
	var mu sync.Mutex
	var asked []string
	ask := func(_ context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
		mu.Lock()
		asked = append(asked, method+" "+string(params))
		mu.Unlock()
		if method == "sampling/createMessage" {
			return json.RawMessage(`{"role":"assistant","content":{"type":"text","text":"four"},"model":"m"}`), nil
		}
		return json.RawMessage(`{"action":"accept","content":{"username":"alice","email":"a@example.com"}}`), nil
	}
	res, err := s.Call(ctx, tool.Call{Tool: byName["test_sampling"], Input: json.RawMessage(`{"prompt":"2+2?"}`), Ask: ask})
	if modern {
		// An input round of this call: relayed, and the answer goes back.
		if err != nil || res.IsError || !strings.Contains(string(res.Content[0]), "four") || len(asked) != 1 {
			t.Errorf("test_sampling = %v %+v, asked %v; want the model's answer relayed", err, res, asked)
		}
		asked = nil
	} else {
		// mcp-go's server sends sampling on its standalone stream, which
		// names no call: it is refused, never given to this call by
		// elimination.
		if err == nil && !res.IsError || err != nil && !strings.Contains(err.Error(), "belongs to no call") {
			t.Errorf("test_sampling = %v %+v, want the upstream's request refused", err, res)
		}
		if len(asked) != 0 {
			t.Errorf("asked %v", asked)
		}
	}
	// Elicitation comes on the call's own stream and reaches its Ask.
	res, err = s.Call(ctx, tool.Call{Tool: byName["test_elicitation"], Input: json.RawMessage(`{"message":"name?"}`), Ask: ask})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Content[0]); !strings.Contains(got, "alice") {
		t.Errorf("test_elicitation = %s", got)
	}

	// Without Ask the upstream's request is refused, and the call says so.
	res, err = s.Call(ctx, tool.Call{Tool: byName["test_sampling"], Input: json.RawMessage(`{"prompt":"x"}`)})
	if err == nil && !res.IsError {
		t.Errorf("test_sampling without Ask = %+v, want an error", res)
	}

	// Log messages may come on the call's stream or the standalone one,
	// so Log may be called from two goroutines.
	var logs []string
	_, err = s.Call(ctx, tool.Call{Tool: byName["test_tool_with_logging"], Input: json.RawMessage(`{}`),
		Log: func(p json.RawMessage) { mu.Lock(); logs = append(logs, string(p)); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Those on the standalone stream name no call and are dropped; those
	// that arrive are the tool's own, in order.
	want := []string{"Tool execution started", "Tool processing data", "Tool execution completed"}
	for _, l := range logs {
		for len(want) > 0 && !strings.Contains(l, want[0]) {
			want = want[1:]
		}
		if len(want) == 0 {
			t.Errorf("log %s is not one of the tool's, in order: %v", l, logs)
			break
		}
		want = want[1:]
	}
	if modern && len(logs) != 3 {
		t.Errorf("logs %v, want all three of the call's on 2026-07-28 (one stream, no other)", logs)
	}
}
