package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// replicaConfig serves the MCP fixture's tools to every caller.
func replicaConfig(t *testing.T, extra string) string {
	return fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q
%s`, testkit.Build(t, testkit.MCPFixture), extra)
}

// TestSessionOpenedOnOneReplicaServedByAnother: two serves given the same
// token secret, each on its own data dir, share no state, yet a
// 2025-11-25 session opened on A is served by B (list and call) as a fresh
// initialized session. A serve with another secret answers 404.
func TestSessionOpenedOnOneReplicaServedByAnother(t *testing.T) {
	const secret = "replica-test-secret-value-41c7e2"
	cfg := replicaConfig(t, "")
	a := testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Config: cfg})
	b := testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Config: cfg})
	tok := a.Token(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, a.URL, tok, "{}")

	st, _, body := testkit.PostSession(t, b.URL, tok, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if st != http.StatusOK || !strings.Contains(string(body), `"fx__echo"`) {
		t.Fatalf("tools/list on B in A's session: %d %s", st, body)
	}
	st, _, body = testkit.PostSession(t, b.URL, tok, sid,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fx__echo","arguments":{"message":"across"}}}`)
	if st != http.StatusOK || !strings.Contains(string(body), "across") || strings.Contains(string(body), `"isError":true`) {
		t.Fatalf("tools/call on B in A's session: %d %s", st, body)
	}
	// Another subject may not use it on B either.
	bob := b.Token(t, token.Claims{Sub: "bob"})
	if st, _, body := testkit.PostSession(t, b.URL, bob, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); st != http.StatusNotFound {
		t.Errorf("bob in alice's session on B: %d %s", st, body)
	}

	// A replica with another secret knows neither the token nor the session:
	// with a token of its own the session is still not found.
	c := testkit.StartCapgate(t, testkit.Capgate{Secret: "another-secret-value-0b9d3f", Config: cfg})
	ctok := c.Token(t, token.Claims{Sub: "alice"})
	if st, _, body := testkit.PostSession(t, c.URL, ctok, sid, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`); st != http.StatusNotFound {
		t.Errorf("A's session on a replica with another secret: %d %s", st, body)
	}
}
