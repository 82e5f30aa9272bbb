package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// The tests here attack "calls happen exactly as decided" through a real
// capgate serve, with an extension pack whose commands record every run.

// callsPack writes the extension pack "calls" into a temp dir. Its
// commands (record: mutating, LOW; danger: CRITICAL; fail: mutating,
// records then fails) append the input they received, one line per run,
// to calls.log beside the pack, wait a little (so concurrent calls overlap)
// and answer with the run's number. It returns the config lines that load
// the pack and grant alice and bob its tools, and the log's path.
func callsPack(t *testing.T) (config, log string) {
	t.Helper()
	root := t.TempDir() // extensions.paths holds packs, one per directory
	dir := filepath.Join(root, "calls")
	// Apart from the pack: no tool creates files beside its own pack,
	// which the sandbox carves out of its writes.
	log = filepath.Join(testkit.ToolDir(t), "calls.log")
	script := `#!/bin/sh
input=$(cat)
printf '%s\n' "$input" >> ` + shellQuote(log) + `
n=$(wc -l < ` + shellQuote(log) + ` | tr -d ' ')
sleep 0.3
if [ "$1" = fail ]; then echo "failed on purpose" >&2; exit 1; fi
printf '{"run": %s}\n' "$n"
`
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "record"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := `id: calls
name: Calls
description: Commands that record every run
commands:
  record:
    description: Record a note
    run: ["./bin/record"]
    input_schema: {type: object}
    risk: LOW
    mutating: true
  fail:
    description: Record, then fail
    run: ["./bin/record", "fail"]
    input_schema: {type: object}
    risk: LOW
    mutating: true
  danger:
    description: Run a command
    run: ["./bin/record"]
    input_schema:
      type: object
      properties:
        cmd: {type: string}
      required: [cmd]
    risk: CRITICAL
`
	writeFile(t, filepath.Join(dir, "extension.yaml"), manifest)
	config = fmt.Sprintf(`
[extensions]
paths = [%q]

[policy.subjects.alice]
grants = ["rye.execute.tool.ext.calls.*"]
[policy.subjects.bob]
grants = ["rye.execute.tool.ext.calls.*"]
`, root)
	return config, log
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// runs are the lines of the pack's log: the inputs the commands got.
func runs(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// rpcAnswer is a capability.invoke answer: the output, or the error's
// stable code and message.
type rpcAnswer struct {
	Output  string // raw JSON
	Code    string
	Message string
}

// invokeRaw posts capability.invoke over /rpc with input spliced in as
// raw bytes, exactly as given (a duplicate key stays a duplicate key).
func (s *served) invokeRaw(t *testing.T, tok, tool, input, key string) rpcAnswer {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":"` + tok +
		`","capability":"` + tool + `","idempotency_key":"` + key + `","input":` + input + `}}`
	resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return rpcAnswer{Code: "transport"}
	}
	defer resp.Body.Close()
	var r struct {
		Result *struct {
			Output json.RawMessage `json:"output"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
			Data    struct {
				Code string `json:"code"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Error(err)
		return rpcAnswer{Code: "decode"}
	}
	if r.Error != nil {
		return rpcAnswer{Code: r.Error.Data.Code, Message: r.Error.Message}
	}
	return rpcAnswer{Output: string(r.Result.Output)}
}

// approvalOf makes the call that needs an approval and returns its id.
func (s *served) approvalOf(t *testing.T, tok, input string) string {
	t.Helper()
	a := s.invokeRaw(t, tok, "ext:calls:danger", input, "")
	id := regexp.MustCompile(`apr_[0-9a-f]{32}`).FindString(a.Message)
	if a.Code != "approval_required" || id == "" {
		t.Fatalf("%s: %+v, want approval_required", input, a)
	}
	return id
}

func (s *served) approve(t *testing.T, id string) string {
	t.Helper()
	out, errb, code := s.run(t, nil, "approve", id, "--config", s.config, "--by", "ops")
	if code != 0 {
		t.Fatalf("approve %s: %d %s %s", id, code, out, errb)
	}
	return out
}

// liveApprovals is capgate approvals --json: id → state.
func (s *served) liveApprovals(t *testing.T) map[string]string {
	t.Helper()
	out, errb, code := s.run(t, nil, "approvals", "--config", s.config, "--json")
	if code != 0 {
		t.Fatalf("approvals: %d %s", code, errb)
	}
	var list []struct{ ID, State string }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("approvals --json: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, a := range list {
		m[a.ID] = a.State
	}
	return m
}

// TestIdempotencyKeyRunsOnce: eight concurrent calls with one key run the
// tool once and all get its result; a call that failed leaves the key
// free for a retry.
func TestIdempotencyKeyRunsOnce(t *testing.T) {
	t.Parallel()
	extra, log := callsPack(t)
	// The calls that wait for the first one's result wait up to a minute
	// (a deadline, not a measure): under load its run took over the 5 s
	// default, and they were told it was in progress.
	s := startServe(t, extra+"\n[idempotency]\nwait = \"1m\"\n")
	alice := s.mint(t, "alice", "private")

	answers := make([]rpcAnswer, 8)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = s.invokeRaw(t, alice, "ext:calls:record", `{"note":"pay invoice 7"}`, "key-1") })
	}
	wg.Wait()
	if got := runs(t, log); len(got) != 1 {
		t.Fatalf("8 concurrent calls with one key ran the tool %d times: %q", len(got), got)
	}
	for i, a := range answers {
		if a.Code != "" || !strings.Contains(a.Output, `"run":1`) && !strings.Contains(a.Output, `"run": 1`) {
			t.Errorf("call %d: %+v, want run 1's result", i, a)
		}
		if a != answers[0] {
			t.Errorf("call %d got %+v, call 0 %+v", i, a, answers[0])
		}
	}
	// Later, the same: a replay, no run.
	if a := s.invokeRaw(t, alice, "ext:calls:record", `{"note":"pay invoice 7"}`, "key-1"); a != answers[0] {
		t.Errorf("replay: %+v", a)
	}
	// The key with another input: refused, no run.
	if a := s.invokeRaw(t, alice, "ext:calls:record", `{"note":"pay invoice 8"}`, "key-1"); a.Code != "capability_invalid_input" ||
		!strings.Contains(a.Message, "already used with another input") {
		t.Errorf("key reused with another input: %+v", a)
	}
	if got := runs(t, log); len(got) != 1 {
		t.Fatalf("replays ran the tool: %q", got)
	}

	// A call that fails keeps no claim: the retry runs.
	for i := range 2 {
		a := s.invokeRaw(t, alice, "ext:calls:fail", `{"note":"try"}`, "key-2")
		if a.Code != "capability_backend_unavailable" {
			t.Errorf("failing call %d: %+v", i, a)
		}
	}
	if got := runs(t, log); len(got) != 3 {
		t.Errorf("a failed call's key blocked its retry: runs %q", got)
	}
}

// TestApprovedInputIsWhatRuns: an approval of {"cmd":"ls"} does not let
// {"cmd":"rm -rf /","cmd":"ls"} run (over /rpc, the fast MCP call and
// mcp-go's path); the operator sees the input they approve; the tool
// gets the canonical bytes that were approved.
func TestApprovedInputIsWhatRuns(t *testing.T) {
	t.Parallel()
	extra, log := callsPack(t)
	s := startServe(t, extra)
	alice := s.mint(t, "alice", "private")

	id := s.approvalOf(t, alice, `{"cmd":"ls"}`)
	out, errb, code := s.run(t, nil, "approvals", "--config", s.config)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, `{"cmd":"ls"}`) {
		t.Errorf("capgate approvals does not show the input: %d %s %s", code, out, errb)
	}
	if out := s.approve(t, id); !strings.Contains(out, `{"cmd":"ls"}`) {
		t.Errorf("capgate approve does not show the input: %s", out)
	}

	smuggled := `{"cmd":"rm -rf /","cmd":"ls"}`
	if a := s.invokeRaw(t, alice, "ext:calls:danger", smuggled, ""); a.Code != "capability_invalid_input" ||
		!strings.Contains(a.Message, `repeats the key "cmd"`) {
		t.Errorf("over /rpc: %+v", a)
	}
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"calls__danger","arguments":` + smuggled + `,` + modernMeta + `}}`
	for _, path := range []struct{ name, body string }{
		{"the fast call", body},
		{"mcp-go's path", strings.Replace(body, `"_meta":{`, `"_meta":{"progressToken":"p1",`, 1)},
	} {
		status, _, b := testkit.PostMCP(t, "http://"+s.addr, alice, "calls__danger", path.body)
		if status != http.StatusOK || !strings.Contains(string(b), `capability_invalid_input: input repeats the key \"cmd\" in $`) ||
			!strings.Contains(string(b), `"isError":true`) {
			t.Errorf("over /mcp, %s: %d %s", path.name, status, b)
		}
	}
	if got := runs(t, log); len(got) != 0 {
		t.Fatalf("the tool ran: %q", got)
	}
	if st := s.liveApprovals(t)[id]; st != "approved" {
		t.Errorf("the approval after the refused calls: %q, want approved (unused)", st)
	}

	// The approved call, spaced otherwise, runs with the canonical bytes.
	if a := s.invokeRaw(t, alice, "ext:calls:danger", "{ \"cmd\" :\n\"ls\" }", ""); a.Code != "" {
		t.Errorf("approved call: %+v", a)
	}
	if got := runs(t, log); len(got) != 1 || got[0] != `{"cmd":"ls"}` {
		t.Errorf("the tool got %q, want exactly the approved {\"cmd\":\"ls\"}", got)
	}
}

// TestApprovalSurvivesRefusals: an approved call refused by the rate
// limit or the schema keeps its approval, and a later call spends it; two
// concurrent calls on one approval run once.
func TestApprovalSurvivesRefusals(t *testing.T) {
	t.Parallel()
	extra, log := callsPack(t)
	// One token every 30 s: slow enough that a loaded machine's approvals
	// between the calls below do not refill one (10 s was not).
	s := startServe(t, extra+"\n[policy.rate_limit]\nper_minute = 2\nburst = 2\n")
	alice, bob := s.mint(t, "alice", "private"), s.mint(t, "bob", "private")

	// An approved input the schema refuses: refused every time, and the
	// approval is not spent on it.
	id := s.approvalOf(t, bob, `{"cmd":5}`)
	s.approve(t, id)
	if a := s.invokeRaw(t, bob, "ext:calls:danger", `{"cmd":5}`, ""); a.Code != "capability_invalid_input" {
		t.Errorf("schema-invalid approved call: %+v", a)
	}
	if st := s.liveApprovals(t)[id]; st != "approved" {
		t.Errorf("after the schema refused the call, approval %s is %q, want approved (unused)", id, st)
	}

	// Two concurrent calls on one approval: one runs, one is told to ask.
	id = s.approvalOf(t, bob, `{"cmd":"once"}`)
	s.approve(t, id)
	answers := make([]rpcAnswer, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = s.invokeRaw(t, bob, "ext:calls:danger", `{"cmd":"once"}`, "") })
	}
	wg.Wait()
	ran, asked := 0, 0
	for _, a := range answers {
		switch a.Code {
		case "":
			ran++
		case "approval_required":
			asked++
		}
	}
	once := 0
	for _, r := range runs(t, log) {
		if r == `{"cmd":"once"}` {
			once++
		}
	}
	if ran != 1 || asked != 1 || once != 1 {
		t.Errorf("two calls on one approval: %+v; the tool ran %d times", answers, once)
	}

	// Two approved calls take alice's two tokens for danger.
	for _, cmd := range []string{"a", "b"} {
		in := `{"cmd":"` + cmd + `"}`
		s.approve(t, s.approvalOf(t, alice, in))
		if a := s.invokeRaw(t, alice, "ext:calls:danger", in, ""); a.Code != "" {
			t.Fatalf("%s: %+v", in, a)
		}
	}
	// The third, approved, is rate-limited; its approval survives.
	id = s.approvalOf(t, alice, `{"cmd":"c"}`)
	s.approve(t, id)
	if a := s.invokeRaw(t, alice, "ext:calls:danger", `{"cmd":"c"}`, ""); a.Code != "rate_limited" {
		t.Fatalf("third call: %+v, want rate_limited", a)
	}
	if st := s.liveApprovals(t)[id]; st != "approved" {
		t.Fatalf("after the rate limit refused the call, approval %s is %q, want approved (unused)", id, st)
	}
	// Once the operator raises the limit (a reload), it runs on the same
	// approval. Waiting the 30 s for the bucket to refill proved no more
	// about the approval and held the test for half a minute; the refill
	// itself is router.TestLimiterForgetsIdleBuckets's and store's.
	cfg, err := os.ReadFile(s.config)
	if err != nil {
		t.Fatal(err)
	}
	raised := strings.Replace(string(cfg), "per_minute = 2\n", "per_minute = 6000\n", 1)
	if raised == string(cfg) {
		t.Fatal("the config has no per_minute = 2 line to raise")
	}
	if err := os.WriteFile(s.config, []byte(raised), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Minute, "serve to apply the reload", func() bool {
		return strings.Contains(s.logs(), "reload applied")
	})
	if a := s.invokeRaw(t, alice, "ext:calls:danger", `{"cmd":"c"}`, ""); a.Code != "" {
		t.Fatalf("the approved call once the limit was raised: %+v", a)
	}
	if _, live := s.liveApprovals(t)[id]; live {
		t.Errorf("approval %s is still live after the call it served", id)
	}
}
