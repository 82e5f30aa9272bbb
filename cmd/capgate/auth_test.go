package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/token"
)

// postInitialize posts an MCP initialize to base+"/mcp" with tok and
// returns the status and the WWW-Authenticate header.
func postInitialize(t *testing.T, base, tok string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

// TestServeExpiredToken: a real `capgate serve` answers a token signed with
// its key but past its exp with a 401 whose error_description says
// "expired", which MCP clients show to the user.
func TestServeExpiredToken(t *testing.T) {
	t.Parallel()
	s := startServe(t, "")
	secret := token.ParseSecret(s.secret)
	now := time.Now()
	expired, err := token.Mint(secret, token.Claims{Sub: "alice", IssuedAt: now.Add(-2 * time.Hour), ExpiresAt: now.Add(-time.Hour)}, token.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	code, www := postInitialize(t, "http://"+s.addr, expired)
	if code != http.StatusUnauthorized || !strings.Contains(www, `error="invalid_token"`) ||
		!strings.Contains(www, `error_description="expired: token expired 1h0m`) {
		t.Errorf("expired token: %d, WWW-Authenticate %q", code, www)
	}
	fresh, err := token.Mint(secret, token.Claims{Sub: "alice"}, token.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if code, www := postInitialize(t, "http://"+s.addr, fresh); code != http.StatusOK {
		t.Errorf("fresh token: %d, WWW-Authenticate %q", code, www)
	}

	// Without an OIDC issuer no OAuth flow could end in a token capgate
	// takes: the metadata names no authorization server.
	resp, err := http.Get("http://" + s.addr + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var meta map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&meta); err != nil || meta["resource"] != "http://"+s.addr+"/mcp" {
		t.Fatalf("metadata %v: %v", meta, err)
	}
	if as, ok := meta["authorization_servers"]; ok {
		t.Errorf("metadata without an issuer lists authorization_servers %v", as)
	}
}
