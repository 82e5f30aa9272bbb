package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
	"github.com/mark3labs/mcp-go/mcp"
)

// The fast call answers exactly as mcp-go does: the same request, sent to
// capgate's front door and to a handler that sends every request through
// mcp-go, gets the same status, type and JSON; and what the fast call must
// not take still reaches mcp-go.
func TestFastCallMatchesMCPGo(t *testing.T) {
	s, front := open(t)
	hs := httptest.NewServer(s.handler(false))
	t.Cleanup(hs.Close)
	tok := mint(t, token.Claims{Sub: "fast"})
	narrow := mint(t, token.Claims{Sub: "narrow", Caps: []string{"rye.fetch.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.echo"}})

	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	call := func(name, rest string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + name + `",` + rest + meta + `}}`
	}
	for _, tc := range []struct {
		name, tok, mcpName, body string
		fast                     bool
	}{
		{"allowed with structured content", tok, "fx__echo", call("fx__echo", `"arguments":{"message":"hi"},`), true},
		{"string id", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"id":7`, `"id":"abc"`, 1), true},
		{"denied by the policy", tok, "fx__t_00", call("fx__t_00", `"arguments":{},`), true},
		{"input the schema refuses", tok, "fx__echo", call("fx__echo", `"arguments":{"nope":1},`), true},
		{"no arguments", tok, "fx__echo", call("fx__echo", ""), true},
		{"a tool the token hides", narrow, "fx__t_00", call("fx__t_00", `"arguments":{},`), false},
		{"an unknown tool", tok, "fx__nope", call("fx__nope", `"arguments":{},`), false},
		{"Mcp-Name disagrees", tok, "fx__slow", call("fx__echo", `"arguments":{"message":"hi"},`), false},
		{"a progress token", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"_meta":{`, `"_meta":{"progressToken":"p1",`, 1), false},
		{"a client that can sample", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `clientCapabilities":{}`, `clientCapabilities":{"sampling":{}}`, 1), false},
		{"no client capabilities", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `,"io.modelcontextprotocol/clientCapabilities":{}`, "", 1), false},
		{"arguments not an object", tok, "fx__echo", call("fx__echo", `"arguments":[1],`), false},
		// What encoding/json reads by its own rules goes to mcp-go.
		{"a key in another case", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"method"`, `"Method"`, 1), false},
		{"a name twice", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"name":"fx__echo"`, `"name":"fx__t_00","name":"fx__echo"`, 1), false},
		{"an escaped key", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"arguments"`, `"\u0061rguments"`, 1), false},
		{"white space everywhere", tok, "fx__echo", " " + strings.NewReplacer(`":`, `" : `, `,"`, ` , "`).Replace(call("fx__echo", `"arguments":{"message":"hi"},`)) + "\n", true},
		// A member the fast call does not know goes to mcp-go: fail closed.
		{"an unknown params member", tok, "fx__echo", call("fx__echo", `"arguments":{"message":"hi"},"newParam":{"x":1},`), false},
		{"an unknown _meta member", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"_meta":{`, `"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"},`, 1), false},
		{"an unknown top-level member", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `"id":7`, `"id":7,"extra":true`, 1), false},
		{"an unknown client capability", tok, "fx__echo", strings.Replace(call("fx__echo", `"arguments":{"message":"hi"},`), `clientCapabilities":{}`, `clientCapabilities":{"tasks":{}}`, 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sameAnswer(t, s, tc.fast, func(base string) (int, string, []byte) {
				return testkit.PostMCP(t, base, tc.tok, tc.mcpName, tc.body)
			}, front, hs.URL)
		})
	}
}

// sameAnswer posts one request to the front door and to mcp-go alone and
// checks that the fast call took it (or not, as fast says) and that both
// answered alike: status, type, and JSON but for the invocation's own id
// and duration (byte for byte when not 200).
func sameAnswer(t *testing.T, s *testServer, fast bool, post func(base string) (int, string, []byte), front, mcpGo string) {
	t.Helper()
	before, streamedBefore := s.MCP.fastCalls.Load(), s.MCP.streamedCalls.Load()
	st1, ct1, b1 := post(front)
	took := s.MCP.fastCalls.Load() - before
	if took != map[bool]int64{true: 1, false: 0}[fast] {
		t.Errorf("fast call taken %d times, want fast=%v", took, fast)
	}
	if s.MCP.streamedCalls.Load() > streamedBefore {
		// A streamed call's answer is its stream's last event, where
		// mcp-go (which sent nothing before it) writes JSON.
		if fast || ct1 != "text/event-stream" {
			t.Errorf("a streamed call (fast %v) answered %s", fast, ct1)
		}
		ct1, b1 = "application/json", lastEvent(t, b1)
	}
	alike(t, st1, ct1, b1, post, mcpGo, true)
}

// lastEvent is the data of the last SSE event of b.
func lastEvent(t *testing.T, b []byte) []byte {
	t.Helper()
	var last string
	for _, line := range strings.Split(string(b), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			last = data
		}
	}
	if last == "" {
		t.Fatalf("no event in %q", b)
	}
	return []byte(last + "\n")
}

// alike posts to mcp-go alone and checks its answer is the front door's
// (status, type, body), as sameAnswer says; every result must carry an
// invocation when ran (a refusal before the router has none).
func alike(t *testing.T, st1 int, ct1 string, b1 []byte, post func(base string) (int, string, []byte), mcpGo string, ran bool) {
	t.Helper()
	st2, ct2, b2 := post(mcpGo)
	if st1 != st2 || ct1 != ct2 {
		t.Errorf("front: %d %s; mcp-go: %d %s", st1, ct1, st2, ct2)
	}
	if st1 != http.StatusOK {
		if !bytes.Equal(b1, b2) {
			t.Errorf("front:\n%s\nmcp-go:\n%s", b1, b2)
		}
		return
	}
	d1, d2 := decode(t, b1), decode(t, b2)
	for _, d := range [][]any{d1, d2} {
		sameInvocation(t, d, ran)
	}
	if !reflect.DeepEqual(d1, d2) {
		t.Errorf("front:\n%s\nmcp-go:\n%s", b1, b2)
	}
}

// sameInvocation checks that each result of d has an invocation id and a
// duration, then blanks them: they differ from call to call.
func sameInvocation(t *testing.T, d []any, need bool) {
	t.Helper()
	for _, v := range d {
		res, _ := v.(map[string]any)["result"].(map[string]any)
		if res == nil {
			continue
		}
		meta, _ := res["_meta"].(map[string]any)
		id, _ := meta["capgate/invocation_id"].(string)
		_, hasDur := meta["capgate/duration_ms"].(float64)
		if !strings.HasPrefix(id, "cap_") || !hasDur {
			if need {
				t.Errorf("result without an invocation id or duration: %v", res)
			}
			continue
		}
		meta["capgate/invocation_id"], meta["capgate/duration_ms"] = "", 0.0
	}
}

// decode reads a JSON body, or the data of the SSE events it holds.
func decode(t *testing.T, b []byte) []any {
	t.Helper()
	var out []any
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return append(out, v)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var v any
			if err := json.Unmarshal([]byte(data), &v); err != nil {
				t.Fatalf("%v: %s", err, data)
			}
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no JSON in %q", b)
	}
	return out
}

// A plain result is written as mcp-go writes it after decoding it; any
// other is left to that decoding.
func TestAppendPlainResult(t *testing.T) {
	text := func(s string) json.RawMessage { return json.RawMessage(s) }
	for _, tc := range []struct {
		name  string
		res   *tool.Result
		plain bool
	}{
		{"text, type first", &tool.Result{Content: []json.RawMessage{text(`{"type":"text","text":"ok"}`)}}, true},
		{"text, text first", tool.TextResult(`say "hi" \ <b>`), true},
		{"two blocks, structured, error", &tool.Result{Content: []json.RawMessage{text(`{"type":"text","text":"a\"}"}`), text(`{"type":"text","text":"b"}`)},
			Structured: json.RawMessage(`{"n":1,"big":12345678901234567}`), IsError: true}, true},
		{"no content", &tool.Result{Content: []json.RawMessage{}}, true},
		{"a key more", &tool.Result{Content: []json.RawMessage{text(`{"type":"text","text":"ok","x":1}`)}}, false},
		{"annotations", &tool.Result{Content: []json.RawMessage{text(`{"type":"text","text":"ok","annotations":{"priority":1}}`)}}, false},
		{"an image", &tool.Result{Content: []json.RawMessage{text(`{"type":"image","data":"aGk=","mimeType":"image/png"}`)}}, false},
		{"spaces", &tool.Result{Content: []json.RawMessage{text(`{"type": "text", "text": "ok"}`)}}, false},
		{"structured array", &tool.Result{Content: []json.RawMessage{text(`{"type":"text","text":"ok"}`)}, Structured: json.RawMessage(`[1]`)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := router.Invocation{ID: "cap_0123456789abcdef01234567", Duration: 1234567, SideEffects: []risk.SideEffect{risk.FSRead, "x.y"}}
			for _, modern := range []bool{true, false} {
				fast, plain := appendPlainResult(nil, tc.res, &inv, modern)
				if plain != tc.plain {
					t.Fatalf("plain = %v, want %v", plain, tc.plain)
				}
				if !plain {
					return
				}
				slow, err := mcpconv.ToResult(tc.res)
				if err != nil {
					t.Fatal(err)
				}
				withInvocation(slow, inv)
				if modern {
					slow.ResultType = mcp.ResultTypeComplete
					slow.EnsureResultMeta().SetServerInfo(serverInfo)
				}
				want, _ := json.Marshal(slow)
				if !reflect.DeepEqual(decode(t, fast), decode(t, want)) {
					t.Errorf("modern %v: fast:\n%s\nmcp-go:\n%s", modern, fast, want)
				}
			}
		})
	}
}

// The same in a 2025-11-25 session: a tools/call in a session mcp-go
// opened is answered by the fast call exactly as mcp-go answers it, and a
// session that could be asked something mid-call, or that asked for log
// messages, is left to mcp-go.
func TestFastCallInASessionMatchesMCPGo(t *testing.T) {
	s, front := open(t)
	hs := httptest.NewServer(s.handler(false))
	t.Cleanup(hs.Close)
	tok := mint(t, token.Claims{Sub: "fast"})
	narrow := mint(t, token.Claims{Sub: "narrow", Caps: []string{"rye.fetch.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.echo"}})
	plain := testkit.OpenSession(t, front, tok, "{}")
	narrowSID := testkit.OpenSession(t, front, narrow, "{}")
	sampling := testkit.OpenSession(t, front, tok, `{"sampling":{}}`)
	leveled := testkit.OpenSession(t, front, tok, "{}")
	if st, _, b := testkit.PostSession(t, front, tok, leveled, `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`); st != 200 {
		t.Fatalf("logging/setLevel: %d %s", st, b)
	}
	call := func(name, args string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + name + `"` + args + `}}`
	}
	echo := call("fx__echo", `,"arguments":{"message":"hi"}`)
	for _, tc := range []struct {
		name, tok, sid, body string
		fast                 bool
	}{
		{"allowed with structured content", tok, plain, echo, true},
		{"string id", tok, plain, strings.Replace(echo, `"id":7`, `"id":"abc"`, 1), true},
		{"denied by the policy", tok, plain, call("fx__t_00", `,"arguments":{}`), true},
		{"input the schema refuses", tok, plain, call("fx__echo", `,"arguments":{"nope":1}`), true},
		{"no arguments", tok, plain, call("fx__echo", ""), true},
		{"white space everywhere", tok, plain, " " + strings.NewReplacer(`":`, `" : `, `,"`, ` , "`).Replace(echo) + "\n", true},
		{"a tool the token hides", narrow, narrowSID, call("fx__t_00", `,"arguments":{}`), false},
		{"an unknown tool", tok, plain, call("fx__nope", `,"arguments":{}`), false},
		{"a progress token", tok, plain, call("fx__echo", `,"arguments":{"message":"hi"},"_meta":{"progressToken":"p1"}`), false},
		{"a client that can sample", tok, sampling, echo, false},
		{"a session that asked for logs", tok, leveled, echo, false},
		{"a modern _meta", tok, plain, call("fx__echo", `,"arguments":{"message":"hi"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}`), false},
		{"a name twice", tok, plain, strings.Replace(echo, `"name":"fx__echo"`, `"name":"fx__t_00","name":"fx__echo"`, 1), false},
		{"another subject's session", narrow, plain, echo, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sameAnswer(t, s, tc.fast, func(base string) (int, string, []byte) {
				return testkit.PostSession(t, base, tc.tok, tc.sid, tc.body)
			}, front, hs.URL)
		})
	}
}

// A session's notifications/cancelled ends the fast call it names.
func TestFastCallInASessionCancelled(t *testing.T) {
	s, front := open(t)
	tok := mint(t, token.Claims{Sub: "fast"})
	sid := testkit.OpenSession(t, front, tok, "{}")
	before := s.MCP.fastCalls.Load()
	done := make(chan string, 1)
	deadline := time.After(30 * time.Second)
	go func() {
		// Three steps of a minute each, unless cancelled.
		_, _, b := testkit.PostSession(t, front, tok, sid, `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"fx__slow","arguments":{"delay_ms":60000}}}`)
		done <- string(b)
	}()
	for {
		select {
		case got := <-done:
			if !strings.Contains(got, `"isError":true`) || s.MCP.fastCalls.Load()-before != 1 {
				t.Errorf("the cancelled call answered %s (fast calls %d)", got, s.MCP.fastCalls.Load()-before)
			}
			return
		case <-time.After(100 * time.Millisecond):
			// The call may not have started yet: cancel until it ends.
			if st, _, b := testkit.PostSession(t, front, tok, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":41,"reason":"enough"}}`); st != http.StatusAccepted {
				t.Fatalf("notifications/cancelled: %d %s", st, b)
			}
		case <-deadline:
			t.Fatal("the call was not cancelled")
		}
	}
}
