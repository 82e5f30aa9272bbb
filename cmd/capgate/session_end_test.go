package main

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestSessionEndedOnEveryReplica: two serves share the token secret and
// the store (one data dir). A 2025-11-25 session opened on A and ended by
// its client's DELETE on A answers 404 on A and on B; another session of
// the same subject goes on being served on both.
func TestSessionEndedOnEveryReplica(t *testing.T) {
	t.Parallel()
	const secret = "replica-test-secret-value-41c7e2"
	data := filepath.Join(t.TempDir(), "data")
	cfg := replicaConfig(t, "")
	start := func(name string) *testkit.Served {
		return testkit.StartCapgate(t, testkit.Capgate{Secret: secret, DataDir: data,
			Config: "replica_id = \"" + name + "\"\n" + cfg + "\n[audit]\npath = \"audit-" + name + ".jsonl\"\n"})
	}
	a, b := start("a"), start("b")
	tok := a.Token(t, token.Claims{Sub: "alice"})
	ended, kept := testkit.OpenSession(t, a.URL, tok, "{}"), testkit.OpenSession(t, a.URL, tok, "{}")
	const list = `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	if st, _, body := testkit.PostSession(t, b.URL, tok, ended, list); st != http.StatusOK {
		t.Fatalf("tools/list on B before the end: %d %s", st, body)
	}
	if st := testkit.DeleteSession(t, a.URL, tok, ended); st/100 != 2 {
		t.Fatalf("DELETE on A: %d", st)
	}
	// A, which ended it, answers 404 at once; B, which read "not ended"
	// from the store just before, within its recheck bound (a second).
	if st, _, body := testkit.PostSession(t, a.URL, tok, ended, list); st != http.StatusNotFound {
		t.Errorf("tools/list on A in the ended session: %d %s, want 404", st, body)
	}
	var st int
	var body []byte
	if !testkit.Poll(10*time.Second, func() bool {
		st, _, body = testkit.PostSession(t, b.URL, tok, ended, list)
		return st == http.StatusNotFound
	}) {
		t.Errorf("tools/list on B in the ended session: %d %s, want 404", st, body)
	}
	for _, r := range []*testkit.Served{a, b} {
		if st, _, body := testkit.PostSession(t, r.URL, tok, kept, list); st != http.StatusOK {
			t.Errorf("tools/list on %s in the other session: %d %s", r.URL, st, body)
		}
	}
}
