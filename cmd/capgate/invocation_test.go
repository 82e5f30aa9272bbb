package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// rpcCall posts one JSON-RPC request to serve's /rpc and decodes the answer.
func (s *served) rpcCall(t *testing.T, method string, params map[string]any) (result json.RawMessage, rpcErr *rpcErrorBody) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Result json.RawMessage
		Error  *rpcErrorBody
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r.Result, r.Error
}

type rpcErrorBody struct {
	Code    int
	Message string
	Data    struct {
		Code, Hint         string
		InvocationID       string `json:"invocation_id"`
		ClientInvocationID string `json:"client_invocation_id"`
	}
}

// auditToolCall waits until serve's audit file has a tool_call record
// with request_id id, and returns that record's tool.
func (s *served) auditToolCall(t *testing.T, id string) string {
	t.Helper()
	var tool string
	var b []byte
	if !testkit.Poll(10*time.Second, func() bool {
		b, _ = os.ReadFile(filepath.Join(s.dir, "data", "audit.jsonl"))
		for _, line := range strings.Split(string(b), "\n") {
			var e struct {
				Type, Tool string
				RequestID  string `json:"request_id"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Type == "tool_call" && e.RequestID == id {
				tool = e.Tool
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no tool_call record with request_id %s in the audit file:\n%s", id, b)
	}
	return tool
}

var invocationID = regexp.MustCompile(`^cap_[0-9a-f]{24}$`)

// TestRPCTakesIDsOnly: capability.invoke resolves tool ids, never MCP
// exposed names; an exposed name the caller may see gets a hint naming
// the id, one it may not see is answered like a missing tool; and every
// id capability.list shows is one capability.invoke resolves.
func TestRPCTakesIDsOnly(t *testing.T) {
	t.Parallel()
	s := startServe(t, "")
	alice := s.mint(t, "alice", "private")

	for _, tc := range []struct{ alias, hint string }{
		{"fx__t_00", "use the capability id mcp:fx:t_00"},
		{"fx__echo", "use the capability id mcp:fx:echo"},
		{"gog__email_list_messages", "use the capability id gog.email with operation list_messages"},
	} {
		_, e := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": alice, "capability": tc.alias, "input": map[string]any{"message": "hi"}})
		if e == nil || e.Data.Code != "capability_not_found" || e.Data.Hint != tc.hint {
			t.Errorf("invoke %s: %+v, want capability_not_found with hint %q", tc.alias, e, tc.hint)
		}
	}
	// The CLI shows the hint.
	_, errb, code := s.as(t, alice, "invoke", "--capability", "fx__t_00", "--input-json", `{}`)
	if code != 1 || !strings.Contains(errb, "capability_not_found") || !strings.Contains(errb, "mcp:fx:t_00") {
		t.Errorf("CLI invoke of an exposed name: %d %s", code, errb)
	}

	// A tool the caller may not fetch: the same answer as a missing one.
	narrow := s.cg.Token(t, token.Claims{Sub: "carol", ChatType: "private", Caps: []string{"rye.execute.tool.mcp.fx.echo"}})
	_, hidden := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": narrow, "capability": "fx__t_00", "input": map[string]any{}})
	_, missing := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": narrow, "capability": "fx__t_99", "input": map[string]any{}})
	if hidden != nil && missing != nil { // each call has its own id
		hidden.Data.InvocationID, missing.Data.InvocationID = "", ""
	}
	if hidden == nil || missing == nil || hidden.Data != missing.Data ||
		strings.ReplaceAll(hidden.Message, "fx__t_00", "X") != strings.ReplaceAll(missing.Message, "fx__t_99", "X") {
		t.Errorf("hidden tool %+v differs from a missing one %+v", hidden, missing)
	}

	// List, then invoke each listed id with each of its operations. The
	// token may see everything and run nothing, so no tool runs: every
	// answer must be the capability gate's, never not-found.
	seer := s.cg.Token(t, token.Claims{Sub: "dave", ChatType: "private", Caps: []string{"rye.fetch.*"}})
	res, e := s.rpcCall(t, "capability.list", map[string]any{"context_token": seer, "include_unavailable": true})
	if e != nil {
		t.Fatalf("list: %+v", e)
	}
	var list struct {
		Capabilities []struct {
			ID         string
			Operations []struct{ Name string }
		}
	}
	if err := json.Unmarshal(res, &list); err != nil || len(list.Capabilities) < 10 {
		t.Fatalf("list: %v %s", err, res)
	}
	n := 0
	for _, c := range list.Capabilities {
		for _, op := range c.Operations {
			_, e := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": seer, "capability": c.ID, "operation": op.Name, "input": map[string]any{}})
			if e == nil || e.Data.Code != "permission_denied" {
				t.Errorf("invoke %s %s: %+v, want permission_denied (the id resolves)", c.ID, op.Name, e)
			}
			n++
		}
	}
	if n < 10 {
		t.Errorf("only %d operations listed", n)
	}
}

// TestResultsCarryInvocation: every call's result says what happened (its
// invocation id, duration and the tool's declared side effects), through
// the RPC (raw and the CLI), mcp-go's MCP path on both protocols and the
// fast call, errors included; the id is the audit record's request_id.
func TestResultsCarryInvocation(t *testing.T) {
	t.Parallel()
	s := startServe(t, `
[mcp.servers.fx.tools.echo]
side_effects = ["network.http"]
`)
	alice := s.mint(t, "alice", "private")
	seen := map[string]bool{}
	check := func(where, id string, dur any, effects any, wantTool string) {
		t.Helper()
		if !invocationID.MatchString(id) || seen[id] {
			t.Errorf("%s: invocation id %q (not well formed, or seen before)", where, id)
		}
		seen[id] = true
		if d, ok := dur.(float64); !ok || d <= 0 {
			t.Errorf("%s: duration_ms %v", where, dur)
		}
		if b, _ := json.Marshal(effects); string(b) != `["network.http"]` && wantTool == "mcp:fx:echo" {
			t.Errorf("%s: side effects %s", where, b)
		}
		if got := s.auditToolCall(t, id); got != wantTool {
			t.Errorf("%s: audit record of %s is for %q, want %q", where, id, got, wantTool)
		}
	}

	// The RPC.
	res, e := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": alice, "capability": "mcp:fx:echo", "input": map[string]any{"message": "hi"}})
	if e != nil {
		t.Fatalf("rpc invoke: %+v", e)
	}
	var r struct {
		OK           bool
		RequestID    string `json:"request_id"`
		InvocationID string `json:"invocation_id"`
		DurationMS   any    `json:"duration_ms"`
		SideEffects  any    `json:"side_effects"`
	}
	if err := json.Unmarshal(res, &r); err != nil || !r.OK || r.RequestID != r.InvocationID {
		t.Fatalf("rpc result: %v %s", err, res)
	}
	check("rpc", r.InvocationID, r.DurationMS, r.SideEffects, "mcp:fx:echo")
	// A refusal names its invocation too.
	_, e = s.rpcCall(t, "capability.invoke", map[string]any{"context_token": alice, "capability": "mcp:fx:t_02", "input": map[string]any{}})
	if e == nil || e.Data.Code != "approval_required" {
		t.Fatalf("rpc invoke t_02: %+v", e)
	}
	if !invocationID.MatchString(e.Data.InvocationID) || s.auditToolCall(t, e.Data.InvocationID) != "mcp:fx:t_02" {
		t.Errorf("rpc refusal: invocation id %q", e.Data.InvocationID)
	}
	// The CLI prints the same fields.
	out, errb, code := s.as(t, alice, "invoke", "--capability", "mcp:fx:echo", "--input-json", `{"message":"hi"}`)
	if code != 0 {
		t.Fatalf("cli invoke: %d %s", code, errb)
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("cli output: %v %s", err, out)
	}
	check("cli", r.InvocationID, r.DurationMS, r.SideEffects, "mcp:fx:echo")

	// mcp-go's path, both protocols; a success and a denial (t_02 needs an
	// approval).
	for _, protocol := range []string{"2025-11-25", "2026-07-28"} {
		c := mcpSession(t, "http://"+s.addr, alice, protocol)
		for _, tc := range []struct{ name, tool string }{{"fx__echo", "mcp:fx:echo"}, {"fx__t_02", "mcp:fx:t_02"}} {
			req := mcp.CallToolRequest{}
			req.Params.Name = tc.name
			req.Params.Arguments = map[string]any{"message": "hi"}
			res, err := c.CallTool(context.Background(), req)
			if err != nil {
				t.Fatalf("%s %s: %v", protocol, tc.name, err)
			}
			if res.Meta == nil {
				t.Fatalf("%s %s: no _meta", protocol, tc.name)
			}
			m := res.Meta.AdditionalFields
			id, _ := m["capgate/invocation_id"].(string)
			check("mcp "+protocol+" "+tc.name, id, m["capgate/duration_ms"], m["capgate/side_effects"], tc.tool)
			if (tc.tool == "mcp:fx:t_02") != res.IsError {
				t.Errorf("%s %s: isError %v", protocol, tc.name, res.IsError)
			}
		}
	}

	// The fast call: a plain stateless tools/call, as TestFastCallMatchesMCPGo
	// has it served without mcp-go. It is served on connections that begin
	// with /mcp: the /rpc calls' kept-alive ones went to net/http.
	http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct{ name, tool string }{{"fx__echo", "mcp:fx:echo"}, {"fx__t_00", "mcp:fx:t_00"}, {"fx__t_02", "mcp:fx:t_02"}} {
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tc.name + `","arguments":{"message":"hi"},` + modernMeta + `}}`
		st, _, b := testkit.PostMCP(t, "http://"+s.addr, alice, tc.name, body)
		var fr struct {
			Result struct {
				Meta map[string]any `json:"_meta"`
			}
		}
		if err := json.Unmarshal(b, &fr); err != nil || st != 200 {
			t.Fatalf("fast call %s: %d %v %s", tc.name, st, err, b)
		}
		id, _ := fr.Result.Meta["capgate/invocation_id"].(string)
		check("fast "+tc.name, id, fr.Result.Meta["capgate/duration_ms"], fr.Result.Meta["capgate/side_effects"], tc.tool)
	}
}

// mcpSession opens an MCP session over HTTP with tok on protocol.
func mcpSession(t *testing.T, base, tok, protocol string) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
	if err != nil {
		t.Fatal(err)
	}
	c := newMCPClient(tr, client.WithProtocolVersion(protocol))
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = protocol
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
}
