package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
)

// mcpAs opens an MCP session on the served capgate with tok.
func (s *served) mcpAs(t *testing.T, tok string, opts ...client.ClientOption) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP("http://"+s.addr+"/mcp",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
	if err != nil {
		t.Fatal(err)
	}
	c := newMCPClient(tr, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = "2025-11-25"
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
}

func callTool(ctx context.Context, t *testing.T, c *client.Client, name string, args map[string]any) (string, bool) {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, _ := json.Marshal(res.Content)
	return string(b), res.IsError
}

// vmHWM is the peak resident set of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestServeBoundsResults sends results over the limit from each kind of
// source through a real capgate serve: a stdio upstream (the default 8MiB
// limit, a 100MB result), a streamable-HTTP upstream, an extension and a
// bridge provider (1MiB limits, 20MB results). Each is refused with
// capability_invalid_output naming the limit, capgate's peak memory stays
// far below the result's size, and the source's next call works.
func TestServeBoundsResults(t *testing.T) {
	t.Parallel()
	fxh := testkit.FreeAddr(t)
	testkit.ServeMCPFixture(t, "-http", fxh, "-bounds")
	packs := t.TempDir()
	os.MkdirAll(filepath.Join(packs, "big"), 0o755)
	os.WriteFile(filepath.Join(packs, "big", "extension.yaml"), []byte(`id: tools.big
name: Big
description: Writes as much output as it is asked for
commands:
  big:
    description: Write N bytes
    run: ["sh", "-c", "n=$(sed 's/[^0-9]//g'); printf '{\"s\":\"'; head -c \"$n\" /dev/zero | tr '\\0' x; printf '\"}'"]
    risk: LOW
`), 0o644)
	s := startServe(t, fmt.Sprintf(`
[mcp.servers.fx.env]
MCPFIXTURE_BOUNDS = "1"
[mcp.servers.fx.tools.big]
risk = "LOW"
[mcp.servers.fx.tools.echo]
risk = "LOW"

[mcp.servers.fxh]
url = "http://%s/mcp"
max_result_bytes = "1MiB"
[mcp.servers.fxh.tools.big]
risk = "LOW"
[mcp.servers.fxh.tools.echo]
risk = "LOW"

[capabilities]
max_output_bytes = "1MiB"

[extensions]
paths = [%q]
max_output_bytes = "1MiB"

[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.fxh.*", "rye.execute.tool.ext.tools.*"]
`, fxh, packs))
	c := s.mcpAs(t, s.mint(t, "alice", "private"))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, tl := range tools.Tools {
		names[tl.Name] = tl.Name
		if strings.HasSuffix(tl.Name, "list_events") {
			names["bridge"] = tl.Name
		}
		if strings.HasSuffix(tl.Name, "big") && strings.Contains(tl.Name, "tools") {
			names["ext"] = tl.Name
		}
	}
	if names["bridge"] == "" || names["ext"] == "" || names["fx__big"] == "" || names["fxh__big"] == "" {
		t.Fatalf("tools: %v", names)
	}
	pid := s.cmd.Process.Pid

	for _, tc := range []struct {
		name, tool string
		args       map[string]any
		limit      string
		next       string
		nextArgs   map[string]any
	}{
		{"stdio", "fx__big", map[string]any{"bytes": 40 << 20}, "8388608 bytes", "fx__echo", map[string]any{"message": "still here"}},
		{"http", "fxh__big", map[string]any{"bytes": 20 << 20}, "1048576 bytes", "fxh__echo", map[string]any{"message": "still here"}},
		{"ext", names["ext"], map[string]any{"n": 20 << 20}, "1048576 bytes", names["ext"], map[string]any{"n": 10}},
		{"bridge", names["bridge"], map[string]any{"big_bytes": 20 << 20}, "1048576 bytes", names["bridge"], map[string]any{"big_bytes": 10}},
	} {
		before := vmHWM(t, pid)
		text, isErr := callTool(ctx, t, c, tc.tool, tc.args)
		after := vmHWM(t, pid)
		t.Logf("%s: capgate VmHWM %d MiB before, %d MiB after", tc.name, before>>20, after>>20)
		if !isErr || !strings.Contains(text, "capability_invalid_output") || !strings.Contains(text, tc.limit) {
			t.Errorf("%s: %s = %.300s, want capability_invalid_output naming the limit %s", tc.name, tc.tool, text, tc.limit)
		}
		// Generous: unbounded, the result alone would be 20-40MB, held
		// several times over (537MB for 100MB before the limit; stdio's
		// 40MB with max_result_bytes = "1GiB" grew it by 280 MiB). 40MB,
		// not 100: the fixture's mcp-go spends seconds of CPU encoding it.
		if grew := after - before; grew > 64<<20 {
			t.Errorf("%s: capgate's peak memory grew by %d MiB", tc.name, grew>>20)
		}
		text, isErr = callTool(ctx, t, c, tc.next, tc.nextArgs)
		if isErr {
			t.Errorf("%s: the next call %s failed: %.300s", tc.name, tc.next, text)
		}
	}
}

// TestServeStrayMessagesReachNobody: alice calls a stdio upstream's tool
// that, after its call ended, sends a log message and a sampling request
// that belong to no call; meanwhile bob's call to the same upstream is the
// only one in flight. Neither reaches bob (or anyone): the log message is
// dropped and the sampling request refused.
func TestServeStrayMessagesReachNobody(t *testing.T) {
	t.Parallel()
	s := startServe(t, `
[mcp.servers.fx.env]
MCPFIXTURE_BOUNDS = "1"
[mcp.servers.fx.tools.stray]
risk = "LOW"
[mcp.servers.fx.tools.slow]
risk = "LOW"
`)
	var mu sync.Mutex
	got := map[string][]string{}
	open := func(who string) *client.Client {
		c := s.mcpAs(t, s.mint(t, who, "private"), client.WithSamplingHandler(samplerFunc(func(_ context.Context, r mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			b, _ := json.Marshal(r.Messages)
			mu.Lock()
			got[who] = append(got[who], "sampling "+string(b))
			mu.Unlock()
			return &mcp.CreateMessageResult{SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("leaked")}, Model: "m"}, nil
		})))
		c.OnNotification(func(n mcp.JSONRPCNotification) {
			if n.Method == "notifications/message" {
				b, _ := json.Marshal(n.Params.AdditionalFields)
				mu.Lock()
				got[who] = append(got[who], "log "+string(b))
				mu.Unlock()
			}
		})
		lv := mcp.SetLevelRequest{}
		lv.Params.Level = mcp.LoggingLevelDebug
		if err := c.SetLevel(context.Background(), lv); err != nil {
			t.Fatal(err)
		}
		return c
	}
	alice, bob := open("alice"), open("bob")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if text, isErr := callTool(ctx, t, alice, "fx__stray", map[string]any{"delay_ms": 300}); isErr || !strings.Contains(text, "later") {
		t.Fatalf("stray: %s", text)
	}
	// bob's call runs about 1.5s, the stray messages come at 0.3s.
	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = "fx__slow", map[string]any{"delay_ms": 500}
	if res, err := bob.CallTool(bctx, req); err != nil || res.IsError {
		t.Errorf("bob's slow call: %v %+v", err, res)
	}
	time.Sleep(300 * time.Millisecond) // anything still on its way
	mu.Lock()
	defer mu.Unlock()
	for who, msgs := range got {
		for _, m := range msgs {
			if strings.Contains(m, "stray") {
				t.Errorf("%s received the stray %s", who, m)
			}
		}
	}
}

type samplerFunc func(context.Context, mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)

func (f samplerFunc) CreateMessage(ctx context.Context, r mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	return f(ctx, r)
}
