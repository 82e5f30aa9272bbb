package main

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/conformance"
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
	t.Parallel()
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

// samplingMeta is the _meta of a 2026-07-28 request from a client that lends
// its model, with tools.
const samplingMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
	`"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},` +
	`"io.modelcontextprotocol/clientCapabilities":{"sampling":{"tools":{}}}}`

// mcpReply is a tools/call answer: a result, or input requests with the
// state to come back with.
type mcpReply struct {
	Result struct {
		IsError       bool                       `json:"isError"`
		ResultType    string                     `json:"resultType"`
		RequestState  string                     `json:"requestState"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
		Content       []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
	Error *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func (r mcpReply) text() string {
	var b strings.Builder
	for _, c := range r.Result.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// callOn posts a 2026-07-28 tools/call of name with args to base, as
// alice's client lending its model: a new call when state is "", else the
// continuation of state with the answer given under key.
func callOn(t *testing.T, base, tok, name, args, state, key, answer string) mcpReply {
	t.Helper()
	params := `"name":"` + name + `","arguments":` + args + `,` + samplingMeta
	if state != "" {
		params += `,"requestState":` + strconv.Quote(state) + `,"inputResponses":{` + strconv.Quote(key) + `:` + answer + `}`
	}
	st, _, body := testkit.PostMCP(t, base, tok, name, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{`+params+`}}`)
	if st != http.StatusOK {
		t.Fatalf("%s on %s: %d %s", name, base, st, body)
	}
	var r mcpReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%s on %s: %v: %s", name, base, err, body)
	}
	return r
}

// useSkillOn is callOn for use_skill of the echoer skill.
func useSkillOn(t *testing.T, base, tok, state, key, answer string) mcpReply {
	t.Helper()
	return callOn(t, base, tok, "use_skill", `{"skill":"echoer","message":"echo hello"}`, state, key, answer)
}

// oneKey is the key of the one input request r carries.
func oneKey(t *testing.T, r mcpReply) string {
	t.Helper()
	if r.Result.ResultType != "input_required" || len(r.Result.InputRequests) != 1 || r.Result.RequestState == "" {
		t.Fatalf("want one input request and a state, got %+v", r.Result)
	}
	for k := range r.Result.InputRequests {
		return k
	}
	return ""
}

// TestUseSkillContinuedOnAnotherReplica: two serves share one data dir
// (one store) and the token secret. A use_skill run begun on A goes on on
// B from the sealed requestState (B runs the tool the model asked for) and
// ends on A. A state is used once, by whichever replica: replaying it is
// refused; so are a changed state and another subject's.
func TestUseSkillContinuedOnAnotherReplica(t *testing.T) {
	t.Parallel()
	const secret = "replica-test-secret-value-41c7e2"
	skillsDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(skillsDir, "echoer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(skillsDir, "echoer", "SKILL.md"), []byte(
		"---\nname: echoer\ndescription: Echo things back\nallowed_tools: [fx__echo]\nmax_iterations: 3\n---\nEcho what you are asked to echo, with the echo tool.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "data")
	cfg := replicaConfig(t, "")
	cfg = strings.Replace(cfg, `grants = [`, `grants = ["rye.execute.directive.echoer", `, 1)
	start := func(name string) *testkit.Served {
		return testkit.StartCapgate(t, testkit.Capgate{Secret: secret, DataDir: data, Args: []string{"--skills-dir", skillsDir},
			Config: "replica_id = \"" + name + "\"\n" + cfg + "\n[audit]\npath = \"audit-" + name + ".jsonl\"\n"})
	}
	a, b := start("a"), start("b")
	alice, bob := a.Token(t, token.Claims{Sub: "alice"}), a.Token(t, token.Claims{Sub: "bob"})

	first := useSkillOn(t, a.URL, alice, "", "", "")
	key := oneKey(t, first)
	s1 := first.Result.RequestState
	useEcho := `{"role":"assistant","model":"m","stopReason":"toolUse","content":{"type":"tool_use","id":"u1","name":"fx__echo","input":{"message":"hello"}}}`

	// Refused before any use: a changed state, and another subject's.
	i, c := len(s1)/2, "A"
	if s1[i] == 'A' {
		c = "B"
	}
	changed := s1[:i] + c + s1[i+1:]
	// A changed state fails its integrity check: a JSON-RPC error (SEP-2322).
	if r := useSkillOn(t, b.URL, alice, changed, key, useEcho); r.Error == nil || !strings.Contains(r.Error.Message, "capability_invalid_input") ||
		!strings.Contains(r.Error.Message, "not one capgate sealed") {
		t.Errorf("a changed state: %+v %+v", r.Result, r.Error)
	}
	if r := useSkillOn(t, b.URL, bob, s1, key, useEcho); !r.Result.IsError || !strings.Contains(r.text(), "capability_invalid_input") {
		t.Errorf("bob with alice's state: %+v %q", r.Result, r.text())
	}

	// B goes on with A's run: it runs the echo and asks the model again.
	second := useSkillOn(t, b.URL, alice, s1, key, useEcho)
	key2 := oneKey(t, second)
	if key != "q1" || key2 != "q2" {
		t.Errorf("input keys %q then %q across replicas, want q1 then q2 as on one", key, key2)
	}
	var asked struct {
		Params struct {
			Messages []json.RawMessage `json:"messages"`
		} `json:"params"`
	}
	json.Unmarshal(second.Result.InputRequests[key2], &asked)
	if len(asked.Params.Messages) != 3 || !strings.Contains(string(asked.Params.Messages[2]), "hello") {
		t.Fatalf("B's question does not carry the run's history and the echo's result: %s", second.Result.InputRequests[key2])
	}
	// The first state was used (on B): A refuses it.
	if r := useSkillOn(t, a.URL, alice, s1, key, useEcho); !r.Result.IsError || !strings.Contains(r.text(), "already used") {
		t.Errorf("replayed state on A: %+v %q", r.Result, r.text())
	}

	// The model takes its time: the run's record counts it, from A's start.
	time.Sleep(300 * time.Millisecond)
	done := `{"role":"assistant","model":"m","stopReason":"endTurn","content":{"type":"text","text":"done: echoed hello"}}`
	last := useSkillOn(t, a.URL, alice, second.Result.RequestState, key2, done)
	if last.Result.IsError || last.Result.ResultType == "input_required" || !strings.Contains(last.text(), "done: echoed hello") {
		t.Fatalf("the run's end on A: %+v %q", last.Result, last.text())
	}
	if r := useSkillOn(t, b.URL, alice, second.Result.RequestState, key2, done); !r.Result.IsError || !strings.Contains(r.text(), "already used") {
		t.Errorf("replayed final state on B: %+v %q", r.Result, r.text())
	}

	// Each replica wrote its own chain, every record naming it: verify
	// checks both, and tail merges them in time order.
	a.Stop(t)
	b.Stop(t)
	logA, logB := filepath.Join(a.Dir, "audit-a.jsonl"), filepath.Join(b.Dir, "audit-b.jsonl")
	code, out, errs := auditRun(t, "audit", "verify", logA, logB)
	if code != 0 || strings.Count(out, "chain intact") != 2 {
		t.Fatalf("audit verify of both replicas' logs: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = auditRun(t, "audit", "tail", "-n", "1000", logA, logB)
	if code != 0 {
		t.Fatalf("audit tail of both: exit %d %s", code, errs)
	}
	var prev time.Time
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var rec struct {
			Time     time.Time `json:"time"`
			Replica  string    `json:"replica"`
			Type     string    `json:"type"`
			Detail   string    `json:"detail"`
			Duration float64   `json:"duration_ms"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("merged line %q: %v", line, err)
		}
		if rec.Time.Before(prev) {
			t.Errorf("merged out of time order at %q", line)
		}
		prev = rec.Time
		seen[rec.Replica]++
		if rec.Type == "skill_run" && (rec.Replica != "a" || rec.Detail != "iterations=2 tool_calls=1 outcome=done" || rec.Duration < 300) {
			t.Errorf("the run's record = %s, want it on a, with the whole run's counts and duration", line)
		}
	}
	t.Logf("records by replica: %v", seen)
	// A ran the start and the end of the run, B the echo in between.
	if seen["a"] == 0 || seen["b"] == 0 || len(seen) != 2 {
		t.Errorf("records by replica = %v, want some of a and b, and no other", seen)
	}
}

// TestParkedCallContinuedThroughAnotherReplica: an upstream's elicitation
// parks the call on A, where the upstream waits (the upstream speaks
// 2026-07-28: its input_required round, relayed, is the park); the client comes back to
// B, which forwards the continuation to A over the authenticated internal
// call, and the answer arrives. The internal path refuses a caller
// without the MAC under the shared secret.
func TestParkedCallContinuedThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	const secret = "replica-test-secret-value-41c7e2"
	data := filepath.Join(t.TempDir(), "data")
	cfg := fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.cf.*"]

[mcp.servers.cf]
url = %q
`, conformance.StartFixture(t))
	start := func(name string) *testkit.Served {
		return testkit.StartCapgate(t, testkit.Capgate{Secret: secret, DataDir: data,
			Config: fmt.Sprintf("replica_id = %q\nadvertise_url = \"http://%s\"\n%s\n[audit]\npath = \"audit-%s.jsonl\"\n", name, testkit.AddrHere, cfg, name)})
	}
	a, b := start("a"), start("b")
	alice := a.Token(t, token.Claims{Sub: "alice"})
	call := func(base, state, key, answer string) mcpReply {
		t.Helper()
		return callOn(t, base, alice, "cf__test_elicitation", `{"message":"who are you?"}`, state, key, answer)
	}
	first := call(a.URL, "", "", "")
	key := oneKey(t, first)
	// capgate speaks 2026-07-28 to the fixture: its input round reaches the
	// client under the upstream's own key, and the upstream's requestState
	// stays on A, with the call.
	if key != "elicit" || strings.Contains(first.Result.RequestState, "{") {
		t.Errorf("the upstream's input round reached the client keyed %q with state %q, want its own key elicit and capgate's sealed state", key, first.Result.RequestState)
	}
	answer := `{"action":"accept","content":{"username":"alice","email":"alice@example.com"}}`
	got := call(b.URL, first.Result.RequestState, key, answer)
	if got.Result.IsError || !strings.Contains(got.text(), "User response: action=accept") || !strings.Contains(got.text(), `"username":"alice"`) {
		t.Fatalf("the continuation through B = %+v %q", got.Result, got.text())
	}

	// An upstream that answers the later round with a JSON-RPC error: the
	// caller gets that error through B as it does on A, not a tool result.
	refuse := func(base, state, key, answer string) mcpReply {
		t.Helper()
		return callOn(t, base, alice, "cf__refuse_after_input", `{}`, state, key, answer)
	}
	name := `{"action":"accept","content":{"name":"alice"}}`
	r := refuse(a.URL, "", "", "")
	onA := refuse(a.URL, r.Result.RequestState, oneKey(t, r), name)
	if onA.Error == nil || onA.Error.Code != -32603 || onA.Error.Message != "refused after input (accept)" {
		t.Fatalf("the upstream's error on A = %+v %+v, want its -32603 and its message", onA.Error, onA.Result)
	}
	r = refuse(a.URL, "", "", "")
	onB := refuse(b.URL, r.Result.RequestState, oneKey(t, r), name)
	if onB.Error == nil || (onB.Error.Code != onA.Error.Code || onB.Error.Message != onA.Error.Message || string(onB.Error.Data) != string(onA.Error.Data)) {
		t.Errorf("the upstream's error through B = %+v %+v, want it as on A: %+v", onB.Error, onB.Result, onA.Error)
	}

	// The internal path: nothing without the MAC, nor with a MAC under
	// another secret, nor with a stale one.
	body := `{"sub":"alice","state":` + strconv.Quote(first.Result.RequestState) + `,"input_responses":{}}`
	now := time.Now().UnixMilli()
	macOf := func(secret string, t int64) string {
		k, _ := hkdf.Key(sha256.New, token.ParseSecret(secret), nil, "capgate internal call v1", 32)
		h := hmac.New(sha256.New, k)
		fmt.Fprintf(h, "%d\n", t)
		h.Write([]byte(body))
		return strconv.FormatInt(t, 10) + "." + hex.EncodeToString(h.Sum(nil))
	}
	for name, header := range map[string]string{
		"no MAC":             "",
		"another secret":     macOf("another-secret-value-0b9d3f", now),
		"a stale timestamp":  macOf(secret, now-int64(time.Hour/time.Millisecond)),
		"a MAC of something": macOf(secret, now)[:20] + "00",
	} {
		req, _ := http.NewRequest("POST", a.URL+"/internal/continue", strings.NewReader(body))
		if header != "" {
			req.Header.Set("Capgate-Replica-Mac", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("internal call with %s: %d, want 403", name, resp.StatusCode)
		}
	}
	// With the right MAC the path answers (the state was used: its job is gone).
	req, _ := http.NewRequest("POST", a.URL+"/internal/continue", strings.NewReader(body))
	req.Header.Set("Capgate-Replica-Mac", macOf(secret, time.Now().UnixMilli()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	reply, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(reply), "unknown or expired") {
		t.Errorf("internal call with the MAC, for a job no longer parked: %d %s", resp.StatusCode, reply)
	}
}
