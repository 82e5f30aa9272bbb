package conformance

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// testErrors: an upstream's JSON-RPC error reaches the caller
// as the upstream gave it (code, message, data), whichever path capgate
// serves the call on (the fast call, or mcp-go's with a progress token),
// with the upstream's 4xx only for a stateless caller; a prompts/get the
// upstream refuses gets its error too; and a resources/read of a URI
// nothing serves names the URI in data.uri (SEP-2164). The upstream is the
// suite's reference server, whose test_missing_capability answers a client
// without sampling with -32021 (HTTP 400) and data.requiredCapabilities.
func testErrors(t *testing.T, cg *testkit.Served) {
	const tok = "" // anonymous, as the suite calls
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}`
	call := func(progress string) string {
		m := meta
		if progress != "" {
			m = strings.Replace(meta, `"_meta":{`, `"_meta":{"progressToken":"`+progress+`",`, 1)
		}
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"test_missing_capability","arguments":{},` + m + `}}}`
	}
	missing := func(t *testing.T, status int, body []byte, wantStatus int) {
		t.Helper()
		e := rpcError(t, body)
		if status != wantStatus || e.Code != -32021 || e.Message != "MissingRequiredClientCapabilityError" ||
			!strings.Contains(string(e.Data), `"requiredCapabilities":{"sampling":{}}`) {
			t.Errorf("got %d %s, want %d and the upstream's -32021 with its message and data", status, body, wantStatus)
		}
	}

	t.Run("2026-07-28", func(t *testing.T) {
		st, _, b := testkit.PostMCP(t, cg.URL, tok, "test_missing_capability", call(""))
		missing(t, st, b, http.StatusBadRequest) // the fast call
		st, _, b = testkit.PostMCP(t, cg.URL, tok, "test_missing_capability", call("p1"))
		missing(t, st, b, http.StatusBadRequest) // mcp-go's path

		const uri = "test://nonexistent-resource"
		st, _, b = testkit.PostMCPMethod(t, cg.URL, tok, "resources/read", uri,
			`{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"`+uri+`",`+meta+`}}}`)
		if e := rpcError(t, b); st != http.StatusBadRequest || e.Code != -32602 || string(e.Data) != `{"uri":"`+uri+`"}` {
			t.Errorf("resources/read of an unknown URI: %d %s, want 400, -32602 and data.uri", st, b)
		}
		// A prompt's arguments the upstream refuses: its -32602, not -32603.
		const prompt = "test_prompt_with_arguments"
		_, _, b = testkit.PostMCPMethod(t, cg.URL, tok, "prompts/get", prompt,
			`{"jsonrpc":"2.0","id":9,"method":"prompts/get","params":{"name":"`+prompt+`","arguments":{"arg1":"x"},`+meta+`}}}`)
		if e := rpcError(t, b); e.Code != -32602 || !strings.Contains(e.Message, "Invalid arguments for prompt "+prompt) {
			t.Errorf("prompts/get without a required argument: %s, want the upstream's -32602", b)
		}
	})
	t.Run("2025-11-25", func(t *testing.T) {
		sid := testkit.OpenSession(t, cg.URL, tok, "{}")
		// A session's call goes to the upstream in a 2025-11-25 session of
		// its own on the fast call as with a progress token on the general
		// path (issue 31): the reference server has no test_missing_capability
		// there, and says so alike on both.
		const fast = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"test_missing_capability","arguments":{}}}`
		slow := strings.Replace(fast, `"arguments":{}`, `"arguments":{},"_meta":{"progressToken":"p1"}`, 1)
		text := func(b []byte) string {
			msg := string(b)
			if i := strings.LastIndex(msg, "data: "); i >= 0 && !strings.HasPrefix(strings.TrimSpace(msg), "{") {
				msg, _, _ = strings.Cut(msg[i+len("data: "):], "\n")
			}
			var m struct {
				Result struct {
					IsError bool `json:"isError"`
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"result"`
			}
			if json.Unmarshal([]byte(msg), &m) != nil || !m.Result.IsError || len(m.Result.Content) != 1 {
				t.Errorf("not one tool error: %s", b)
				return ""
			}
			return m.Result.Content[0].Text
		}
		st1, _, b1 := testkit.PostSession(t, cg.URL, tok, sid, fast)
		st2, _, b2 := testkit.PostSession(t, cg.URL, tok, sid, slow)
		if t1, t2 := text(b1), text(b2); st1 != http.StatusOK || st2 != http.StatusOK || t1 != t2 || !strings.Contains(t1, "test_missing_capability not found") {
			t.Errorf("the fast call answered %d %s, the general path %d %s; want the upstream's same answer from its 2025-11-25 session", st1, b1, st2, b2)
		}

		const uri = "test://nonexistent-resource"
		_, _, b := testkit.PostSession(t, cg.URL, tok, sid, `{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"`+uri+`"}}`)
		if e := rpcError(t, b); e.Code != -32002 || string(e.Data) != `{"uri":"`+uri+`"}` {
			t.Errorf("resources/read of an unknown URI in a session: %s, want -32002 and data.uri", b)
		}
	})
}

type jsonrpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// rpcError reads the JSON-RPC error of an answer, JSON or the last data
// of an SSE stream.
func rpcError(t *testing.T, body []byte) jsonrpcError {
	t.Helper()
	msg := string(body)
	if i := strings.LastIndex(msg, "data: "); i >= 0 && !strings.HasPrefix(strings.TrimSpace(msg), "{") {
		msg, _, _ = strings.Cut(msg[i+len("data: "):], "\n")
	}
	var m struct {
		Error *jsonrpcError `json:"error"`
	}
	if err := json.Unmarshal([]byte(msg), &m); err != nil || m.Error == nil {
		t.Errorf("not a JSON-RPC error: %s", body)
		return jsonrpcError{}
	}
	return *m.Error
}
