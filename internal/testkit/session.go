package testkit

import (
	"io"
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
	resp := postSession(tb, base, tok, sid, body)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

func postSession(tb testing.TB, base, tok, sid, body string) *http.Response {
	tb.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("MCP-Protocol-Version", SessionProtocol)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	return resp
}
