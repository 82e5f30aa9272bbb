//go:build unix

package conformance

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/token"
)

// TestPollingResumedOnAnotherReplica (issue 31, item 3, replicas): two
// `capgate serve` replicas on one PostgreSQL, over an upstream that closes
// a call's stream with a retry before its result. Alice's call goes to
// replica a, which passes the close on; she comes back to replica b with
// Last-Event-ID, b forwards the resume to a (the stream id names a,
// sealed), a resumes the upstream, and the result reaches her through b,
// once (the upstream resumed once, one result event, one tool_call
// record, and the delivered stream is gone). Before b forwards anything:
// the id from another session of hers, from bob's, a forged id and one
// changed by a character are refused as an unknown one is, and the
// upstream is not resumed. Once a is stopped, then killed, a resume of a
// stream it held fails at b with a 502 naming a (after 10 s, at once).
func TestPollingResumedOnAnotherReplica(t *testing.T) {
	t.Parallel()
	up := startPollingUpstream(t)
	a, b := startReplicas(t, "up", fmt.Sprintf("url = %q\nprefix = \"\"", up.url))
	alice, bob := a.Token(t, token.Claims{Sub: "alice"}), a.Token(t, token.Claims{Sub: "bob"})
	sid := testkit.OpenSession(t, a.URL, alice, "{}")

	// call makes call id on a; its stream ends with the upstream's pause.
	call := func(id int) sseEvent {
		t.Helper()
		resp := testkit.SessionRequest(t, http.MethodPost, a.URL, alice, sid, fmt.Sprintf(
			`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"poll","arguments":{"retry_ms":30000,"result":{"content":[{"type":"text","text":"polled %d"}]}},"_meta":{"progressToken":"p"}}}`,
			id, id))
		evs := readEvents(t, resp.Body)
		if len(evs) != 2 || evs[1].retry != "30000" || !strings.HasPrefix(evs[1].id, "cgs_") {
			t.Fatalf("call %d on a: the stream carried %+v, want the priming event and then the pause", id, evs)
		}
		return evs[1]
	}
	// resume sends a resume to base within a minute (a hung one fails),
	// and returns its status and body.
	resume := func(base, tok, session, last string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/mcp", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("MCP-Protocol-Version", testkit.SessionProtocol)
		req.Header.Set("Last-Event-ID", last)
		resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("resume from %s at %s: %v", last, base, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("resume from %s at %s: %v", last, base, err)
		}
		return resp.StatusCode, string(body)
	}

	pause := call(1)
	stream := streamOf(pause.id)
	forged := make([]byte, 60)
	rand.Read(forged)
	changed := []byte(stream)
	if i := len(changed) / 2; changed[i] == 'x' { // one character of the sealed part, another
		changed[i] = 'y'
	} else {
		changed[i] = 'x'
	}
	refused := map[string][3]string{
		"another session of alice's": {alice, testkit.OpenSession(t, b.URL, alice, "{}"), pause.id},
		"bob's session":              {bob, testkit.OpenSession(t, b.URL, bob, "{}"), pause.id},
		"a forged id":                {alice, sid, "cgs_" + base64.RawURLEncoding.EncodeToString(forged) + "-1"},
		"an id changed":              {alice, sid, string(changed) + "-1"},
		"an unknown id":              {alice, sid, "cgs_00ff-1"},
	}
	for name, r := range refused {
		status, body := resume(b.URL, r[0], r[1], r[2])
		if status != http.StatusNotFound || !strings.Contains(body, "no stream to resume") {
			t.Errorf("resume with %s at b: %d %q, want 404 as for an unknown stream", name, status, body)
		}
	}
	if got := up.resumed(); len(got) != 0 {
		t.Fatalf("the upstream was resumed %d times by refused resumes", len(got))
	}

	status, body := resume(b.URL, alice, sid, pause.id)
	if status != http.StatusOK {
		t.Fatalf("alice's resume at b: %d %q", status, body)
	}
	rest := readEvents(t, io.NopCloser(strings.NewReader(body)))
	if len(rest) != 1 || rest[0].id != stream+"-2" {
		t.Fatalf("alice's resume at b carried %+v, want the result alone, as event 2 of a's stream", rest)
	}
	text, isError, inv := toolResult(t, rest[0], 1)
	if text != "polled 1" || isError {
		t.Errorf("the result through b: %q (isError %v), want the upstream's", text, isError)
	}
	if got := up.resumed(); len(got) != 1 {
		t.Errorf("the upstream was resumed %d times, want once", len(got))
	}
	if calls := toolCalls(t, a, inv); len(calls) != 1 || calls[0]["decision"] != "allow" {
		t.Errorf("a's tool_call records of invocation %s: %v, want one, allowed", inv, calls)
	}
	// Delivered, the stream is gone: a second resume gets nothing again.
	if status, body := resume(b.URL, alice, sid, pause.id); status != http.StatusNotFound {
		t.Errorf("a second resume of the delivered stream at b: %d %q, want 404", status, body)
	}

	// The holder hung (stopped: it accepts connections and answers
	// nothing), then gone: b says so, naming it, and does not wait on it.
	pause = call(2)
	a.Freeze(t) // stopped, not only sent SIGSTOP: until then a may answer
	status, body = resume(b.URL, alice, sid, pause.id)
	if status != http.StatusBadGateway || !strings.Contains(body, `held by replica "a", which did not answer within`) {
		t.Errorf("a resume at b of a's stream with a stopped: %d %q, want 502 naming replica a", status, body)
	}
	a.Kill()
	testkit.WaitFor(t, 30*time.Second, "replica a to be gone", func() bool {
		_, err := http.Get(a.URL + "/healthz")
		return err != nil
	})
	status, body = resume(b.URL, alice, sid, pause.id)
	if status != http.StatusBadGateway || !strings.Contains(body, `held by replica "a", which does not answer`) {
		t.Errorf("a resume at b of a's stream with a gone: %d %q, want 502 naming replica a", status, body)
	}
	// The replica's id names it; its address is the operators' (in b's
	// log), not the caller's.
	if host := strings.TrimPrefix(a.URL, "http://"); strings.Contains(body, host) {
		t.Errorf("a resume at b of a's stream with a gone shows a's address %s: %q", host, body)
	}
}

// startReplicas starts replicas a and b of capgate on one PostgreSQL,
// serving the upstream named name (its table's lines) to alice and bob.
func startReplicas(t *testing.T, name, upstream string) (a, b *testkit.Served) {
	t.Helper()
	db := pgtest.Start(t)
	const secret = "stream-replicas-secret-0123456789"
	cfg := fmt.Sprintf(`
[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.%[1]s.*"]
[policy.subjects.bob]
grants = ["rye.execute.tool.mcp.%[1]s.*"]

[mcp.servers.%[1]s]
%[2]s
risk = "LOW"

[store]
url = %[3]q
`, name, upstream, db)
	start := func(name string) *testkit.Served {
		return testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Config: cfg,
			Env:    []string{"CAPGATE_STORE_KEY=" + strings.Repeat("5e", 32)},
			Server: fmt.Sprintf("replica_id = %q\nadvertise_url = \"http://%s\"", name, testkit.AddrHere)})
	}
	return start("a"), start("b")
}

// TestStreamedCallAnsweredOnAnotherReplica (issue 31, "Done when": a
// multi-round-trip call whose rounds land on different replicas, on
// 2025-11-25): alice's call, on replica a, asks her for input (the
// upstream's elicitation, an elicitation/create request on the call's
// stream); she POSTs her answer to replica b, which forwards it to a (the
// request's id carries the stream's sealed id), and the call's result,
// made from her answer, comes on its stream at a. Bob posting an answer
// under that id at b first reaches nothing: the call takes alice's.
func TestStreamedCallAnsweredOnAnotherReplica(t *testing.T) {
	t.Parallel()
	a, b := startReplicas(t, "cf", fmt.Sprintf("url = %q", StartFixture(t)))
	alice, bob := a.Token(t, token.Claims{Sub: "alice"}), a.Token(t, token.Claims{Sub: "bob"})
	sid := testkit.OpenSession(t, a.URL, alice, `{"elicitation":{}}`)
	resp := testkit.SessionRequest(t, http.MethodPost, a.URL, alice, sid,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"cf__test_elicitation","arguments":{"message":"who are you?"}}}`)
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("tools/call on a: %d %s", resp.StatusCode, ct)
	}
	timer := time.AfterFunc(time.Minute, func() { resp.Body.Close() }) // nothing waits longer
	defer timer.Stop()
	events := streamEvents(resp.Body)
	var ask struct {
		ID     string `json:"id"`
		Method string `json:"method"`
	}
	for ev := range events {
		if ev.data != "" {
			if err := json.Unmarshal([]byte(ev.data), &ask); err != nil || ask.Method != "elicitation/create" || !strings.HasPrefix(ask.ID, "cgs_") {
				t.Fatalf("the call's stream carried %s, want its elicitation/create under an id of capgate's", ev.data)
			}
			break
		}
	}
	if ask.ID == "" {
		t.Fatal("the call's stream ended without asking")
	}
	answer := func(tok, session, content string) (int, string) {
		t.Helper()
		st, _, body := testkit.PostSession(t, b.URL, tok, session,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"result":{"action":"accept","content":%s}}`, ask.ID, content))
		return st, string(body)
	}
	bobs := testkit.OpenSession(t, b.URL, bob, "{}")
	answer(bob, bobs, `{"username":"bob","email":"bob@example.com"}`)
	if st, body := answer(alice, sid, `{"username":"alice","email":"alice@example.com"}`); st != http.StatusAccepted {
		t.Fatalf("alice's answer at b: %d %s, want 202", st, body)
	}
	var last sseEvent
	for ev := range events {
		last = ev
	}
	if !timer.Stop() {
		t.Fatal("the call's stream did not end within a minute of its start")
	}
	text, isError, _ := toolResult(t, last, 7)
	if isError || !strings.Contains(text, "action=accept") || !strings.Contains(text, `"username":"alice"`) {
		t.Errorf("the call answered through b ended with %q (isError %v), want alice's answer", text, isError)
	}
}

// streamOf is the stream of event id id ("<stream>-<n>").
func streamOf(id string) string { return id[:strings.LastIndexByte(id, '-')] }
