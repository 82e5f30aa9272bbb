package testkit

import (
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
)

// SessionProtocol is the session revision OpenSession negotiates.
const SessionProtocol = "2025-11-25"

// OpenSession opens a 2025-11-25 session on base+"/mcp" with the token,
// as a client whose capabilities are caps (JSON, "{}" for none): it sends
// initialize and notifications/initialized and returns the session id.
func OpenSession(tb testing.TB, base, tok, caps string) string {
	tb.Helper()
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + SessionProtocol +
		`","capabilities":` + caps + `,"clientInfo":{"name":"testkit","version":"1"}}}`
	resp := postSession(tb, base, tok, "", init)
	sid := resp.Header.Get("Mcp-Session-Id")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || sid == "" {
		tb.Fatalf("initialize: %d, session %q: %s", resp.StatusCode, sid, b)
	}
	resp = postSession(tb, base, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		tb.Fatalf("notifications/initialized: %d", resp.StatusCode)
	}
	return sid
}

// PostSession posts one JSON-RPC message in session sid and returns the
// status, the content type and the body.
func PostSession(tb testing.TB, base, tok, sid, body string) (int, string, []byte) {
	tb.Helper()
	return post(tb, base, tok, body, sessionHeaders(sid))
}

// PostSessionWith is PostSession with more headers.
func PostSessionWith(tb testing.TB, base, tok, sid, body string, more map[string]string) (int, string, []byte) {
	tb.Helper()
	h := sessionHeaders(sid)
	if h == nil {
		h = map[string]string{}
	}
	maps.Copy(h, more)
	return post(tb, base, tok, body, h)
}

func postSession(tb testing.TB, base, tok, sid, body string) *http.Response {
	tb.Helper()
	return postMCP(tb, base, tok, body, sessionHeaders(sid))
}

func sessionHeaders(sid string) map[string]string {
	if sid == "" {
		return nil
	}
	return map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": SessionProtocol}
}

// DeleteSession ends session sid on base+"/mcp" as its client does
// (HTTP DELETE) and returns the status.
func DeleteSession(tb testing.TB, base, tok, sid string) int {
	tb.Helper()
	req, err := http.NewRequest(http.MethodDelete, base+"/mcp", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	for k, v := range sessionHeaders(sid) {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// SessionRequest sends one request in session sid (a POST with body, or a
// GET that listens or resumes) as tok ("" sends no Authorization), with
// more headers as name, value pairs, and returns the response unread, for
// a test that reads its stream; the test's end closes it.
func SessionRequest(tb testing.TB, method, base, tok, sid, body string, headers ...string) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), method, base+"/mcp", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", SessionProtocol)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { resp.Body.Close() })
	return resp
}
