package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// panicky is a real tool.Source, in process, whose tool boom panics when
// asked to, as a source with a bug would, and otherwise answers.
type panicky struct{}

func (panicky) ID() string      { return "px" }
func (panicky) Kind() tool.Kind { return tool.KindMCP }
func (panicky) List(context.Context) ([]*tool.Descriptor, error) {
	return []*tool.Descriptor{{
		ID: tool.ID(tool.KindMCP, "px", "boom"), Kind: tool.KindMCP, Source: "px", Name: "boom",
		Description: "panics on request", Available: true, InputSchema: json.RawMessage(`{"type":"object"}`),
		Risk: risk.Assessment{Level: risk.Low},
	}}, nil
}
func (panicky) Call(_ context.Context, c tool.Call) (*tool.Result, error) {
	if bytes.Contains(c.Input, []byte(`"panic"`)) {
		var m map[string]int
		m["boom"]++ // a nil map write: a plain bug
	}
	return tool.TextResult("fine"), nil
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// servePanicky wires a Server as app.Open does (real store, audit file,
// router, MCP server, Serve on a loopback port), its registry over the
// panicky source. It returns the server, its URL and its log.
func servePanicky(t *testing.T) (*testServer, string, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	s, url := serveSetup(t, setup{
		sources: []tool.Source{panicky{}},
		grants:  []string{"rye.fetch.*", "rye.execute.tool.mcp.px.*"},
		logger:  slog.New(slog.NewTextHandler(logs, nil)),
	})
	return s, url, logs
}

// TestPanicInACall: a source that panics mid-call, reached over /rpc, the
// fast MCP call (stateless and in a session) and mcp-go's path (its job goroutine), ends as an
// internal_error result that the audit file records; the server serves
// the next call; the log has the panic and its stack, not the input.
func TestPanicInACall(t *testing.T) {
	s, url, logs := servePanicky(t)
	tok := mint(t, token.Claims{Sub: "alice"})
	secretInput := `{"how":"panic","note":"input-secret-8c1f"}`

	do := func(req *http.Request) string {
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	mcpCall := func(args string, slow bool) string {
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"px__boom","arguments":` + args + `,` + meta + `}}`
		if slow { // a progress token: not the fast call, mcp-go's job
			body = strings.Replace(body, `"_meta":{`, `"_meta":{"progressToken":"p1",`, 1)
		}
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "px__boom")
		return do(req)
	}
	sid := testkit.OpenSession(t, url, tok, "{}")
	sessionCall := func(args string) string {
		body := `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"px__boom","arguments":` + args + `}}`
		_, _, b := testkit.PostSession(t, url, tok, sid, body)
		return string(b)
	}
	rpcCall := func(args string) string {
		body := `{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":"` + tok +
			`","capability":"mcp:px:boom","input":` + args + `}}`
		req, _ := http.NewRequest("POST", url+"/rpc", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return do(req)
	}

	for _, way := range []struct {
		name      string
		call      func(args string) string
		want, ok  string
		fastCalls int64
	}{
		{"rpc", rpcCall, `"code":"internal_error"`, `"ok":true`, 0},
		{"fast call", func(a string) string { return mcpCall(a, false) }, `internal_error: internal error`, `"text":"fine"`, 1},
		{"fast call in a session", sessionCall, `internal_error: internal error`, `"text":"fine"`, 1},
		{"mcp-go job", func(a string) string { return mcpCall(a, true) }, `internal_error: internal error`, `fine`, 0},
	} {
		before := s.MCP.fastCalls.Load()
		if got := way.call(secretInput); !strings.Contains(got, way.want) || strings.Contains(got, "input-secret") {
			t.Errorf("%s: a panicking call answered %s", way.name, got)
		}
		// The server lives on and serves the next call.
		if got := way.call(`{"how":"calmly"}`); !strings.Contains(got, way.ok) {
			t.Errorf("%s: the call after the panic answered %s", way.name, got)
		}
		if n := s.MCP.fastCalls.Load() - before; n != 2*way.fastCalls {
			t.Errorf("%s: %d fast calls, want %d", way.name, n, 2*way.fastCalls)
		}
	}

	if err := s.Audit.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	panics := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev struct {
			Type, Tool, Decision, Code, Detail string
		}
		json.Unmarshal([]byte(line), &ev)
		if ev.Type == string(audit.TypeToolCall) && ev.Tool == "mcp:px:boom" && ev.Code == "internal_error" &&
			ev.Decision == "error" && ev.Detail == "panic" {
			panics++
		}
	}
	if panics != 4 {
		t.Errorf("the audit file records %d panicked calls, want 4:\n%s", panics, b)
	}
	if l := logs.String(); strings.Count(l, "tool call panicked") != 4 || !strings.Contains(l, "assignment to entry in nil map") ||
		!strings.Contains(l, "panicky.Call") || strings.Contains(l, "input-secret") {
		t.Errorf("the log:\n%s", l)
	}
}
