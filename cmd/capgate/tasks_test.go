package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/token"
)

// The MCP tasks extension (SEP-2663) through a real capgate serve, with a
// real upstream that offers it (internal/testkit/tasksfixture, on mcp-go)
// and raw 2026-07-28 requests over streamable HTTP.

// startTasksFixture serves the tasks fixture and returns its address.
func startTasksFixture(t *testing.T) string {
	t.Helper()
	addr := testkit.FreeAddr(t)
	testkit.ServeFixture(t, testkit.TasksFixture, 15*time.Second, addr, "-http", addr)
	return addr
}

// tasksConfig is capgate's config over the fixture at addr: alice and bob
// may call all its tools.
func tasksConfig(addr string) string {
	return fmt.Sprintf(`
[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.tk.*"]
[policy.subjects.bob]
grants = ["rye.execute.tool.mcp.tk.*"]

[mcp.servers.tk]
url = "http://%s/mcp"
risk = "LOW"
`, addr)
}

// metaTasks is a stateless request's _meta declaring the tasks extension;
// metaPlain declares nothing.
const (
	metaTasks = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}`
	metaPlain = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
)

// rpcAnswer2026 is a JSON-RPC answer with its HTTP status.
type rpcAnswer2026 struct {
	Status int
	Result map[string]json.RawMessage
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	Raw string
}

func (a rpcAnswer2026) str(k string) string {
	var s string
	json.Unmarshal(a.Result[k], &s)
	return s
}

// post2026 posts one stateless request as tok and reads its JSON answer.
func post2026(t *testing.T, base, tok, method, name, params string) rpcAnswer2026 {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":%q,"params":{%s}}`, method, params)
	status, ctype, b := testkit.PostMCPMethod(t, base, tok, method, name, body)
	return read2026(t, method, status, ctype, b)
}

// read2026 reads the JSON answer to a stateless request.
func read2026(t *testing.T, method string, status int, ctype string, b []byte) rpcAnswer2026 {
	t.Helper()
	a := rpcAnswer2026{Status: status, Raw: string(b)}
	if !strings.HasPrefix(ctype, "application/json") {
		t.Fatalf("%s: content type %q: %s", method, ctype, b)
	}
	var msg struct {
		Result map[string]json.RawMessage `json:"result"`
		Error  json.RawMessage            `json:"error"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		t.Fatalf("%s: %v: %s", method, err, b)
	}
	a.Result = msg.Result
	if msg.Error != nil {
		json.Unmarshal(msg.Error, &a.Error)
	}
	return a
}

func taskGet(t *testing.T, base, tok, id, meta string) rpcAnswer2026 {
	t.Helper()
	return post2026(t, base, tok, "tasks/get", id, fmt.Sprintf(`"taskId":%q,%s`, id, meta))
}

// createTask calls tool as tok declaring the extension and returns the
// task id capgate answered with.
func createTask(t *testing.T, base, tok, tool, args string) string {
	t.Helper()
	a := post2026(t, base, tok, "tools/call", tool, fmt.Sprintf(`"name":%q,"arguments":%s,%s`, tool, args, metaTasks))
	id := a.str("taskId")
	if a.Status != http.StatusOK || a.str("resultType") != "task" || a.str("status") == "" || !strings.HasPrefix(id, "cgt_") || len(id) != 36 {
		t.Fatalf("%s declaring tasks: want a CreateTaskResult under capgate's id, got %d %s", tool, a.Status, a.Raw)
	}
	if _, nested := a.Result["task"]; nested {
		t.Errorf("CreateTaskResult must be flat: %s", a.Raw)
	}
	var meta struct {
		Invocation string `json:"capgate/invocation_id"`
	}
	if json.Unmarshal(a.Result["_meta"], &meta); !strings.HasPrefix(meta.Invocation, "cap_") {
		t.Errorf("CreateTaskResult without the invocation that made it: %s", a.Raw)
	}
	return id
}

// awaitStatus polls tasks/get as tok until the task is in one of want.
func awaitStatus(t *testing.T, base, tok, id string, want ...string) rpcAnswer2026 {
	t.Helper()
	var a rpcAnswer2026
	if !testkit.Poll(20*time.Second, func() bool {
		a = taskGet(t, base, tok, id, metaTasks)
		for _, w := range want {
			if a.str("status") == w {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("task %s never reached %v: %s", id, want, a.Raw)
	}
	return a
}

// wantNotFound checks an answer is the extension's task not found, and
// nothing more.
func wantNotFound(t *testing.T, what string, a rpcAnswer2026) {
	t.Helper()
	if a.Status != http.StatusBadRequest || a.Error == nil || a.Error.Code != -32602 ||
		a.Error.Message != "Failed to retrieve task: Task not found" || len(a.Error.Data) != 0 || a.Result != nil {
		t.Errorf("%s: want 400 -32602 task not found and nothing else, got %d %s", what, a.Status, a.Raw)
	}
}

// TestTasksRelayed: an upstream offers tasks, so capgate advertises the
// extension; the caller that made a task polls it to its result, answers
// its input request, cancels it; another caller is told each task does
// not exist, exactly as for an id nobody made, and changes nothing; the
// task methods of a caller that does not declare the extension answer
// -32021; a call that does not declare it runs synchronously; every task
// method leaves an audit record.
func TestTasksRelayed(t *testing.T) {
	t.Parallel()
	fx := startTasksFixture(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: tasksConfig(fx)})
	alice := cg.Token(t, token.Claims{Sub: "alice"})
	bob := cg.Token(t, token.Claims{Sub: "bob"})
	base := cg.URL

	if a := post2026(t, base, alice, "server/discover", "", metaPlain); !strings.Contains(string(a.Result["capabilities"]), `"extensions":{"io.modelcontextprotocol/tasks":{}}`) {
		t.Fatalf("server/discover does not advertise the tasks extension: %s", a.Raw)
	}

	t.Run("owner polls to the result", func(t *testing.T) {
		id := createTask(t, base, alice, "tk__slow_compute", `{"seconds":1,"label":"first"}`)
		if a := taskGet(t, base, alice, id, metaTasks); a.Status != 200 || a.str("taskId") != id || a.str("resultType") != "complete" {
			t.Fatalf("owner's tasks/get: %d %s", a.Status, a.Raw)
		}
		wantNotFound(t, "bob's tasks/get of alice's task", taskGet(t, base, bob, id, metaTasks))
		a := awaitStatus(t, base, alice, id, "completed", "failed", "cancelled")
		if a.str("status") != "completed" || !strings.Contains(string(a.Result["result"]), `"text":"computed first"`) || a.str("taskId") != id {
			t.Fatalf("the task's end: %s", a.Raw)
		}
		wantNotFound(t, "bob's tasks/get of alice's finished task", taskGet(t, base, bob, id, metaTasks))
	})

	t.Run("another caller cannot tell a task exists", func(t *testing.T) {
		id := createTask(t, base, alice, "tk__slow_compute", `{"seconds":30,"label":"long"}`)
		made := "cgt_" + strings.Repeat("ab", 16)
		for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
			params := `"inputResponses":{"confirm":{"action":"accept","content":{"ok":true}}},`
			theirs := post2026(t, base, bob, m, id, fmt.Sprintf(`"taskId":%q,%s%s`, id, params, metaTasks))
			none := post2026(t, base, bob, m, made, fmt.Sprintf(`"taskId":%q,%s%s`, made, params, metaTasks))
			wantNotFound(t, "bob's "+m+" of alice's task", theirs)
			if theirs.Raw != none.Raw || theirs.Status != none.Status {
				t.Errorf("bob's %s tells alice's task from an unknown id: %s vs %s", m, theirs.Raw, none.Raw)
			}
		}
		// The routing header must name the task the body names.
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":9,"method":"tasks/get","params":{"taskId":%q,%s}}`, id, metaTasks)
		if st, _, b := testkit.PostMCPMethod(t, base, alice, "tasks/get", made, body); st != http.StatusBadRequest || !strings.Contains(string(b), `"code":-32020`) {
			t.Errorf("tasks/get whose Mcp-Name is another id: want 400 -32020, got %d %s", st, b)
		}
		// Bob's cancel changed nothing.
		if a := taskGet(t, base, alice, id, metaTasks); a.str("status") != "working" {
			t.Errorf("after bob's cancel, alice's task: %s", a.Raw)
		}
		a := post2026(t, base, alice, "tasks/cancel", id, fmt.Sprintf(`"taskId":%q,%s`, id, metaTasks))
		if a.Status != 200 || a.Error != nil || a.str("resultType") != "complete" {
			t.Fatalf("owner's tasks/cancel: %d %s", a.Status, a.Raw)
		}
		awaitStatus(t, base, alice, id, "cancelled")
	})

	t.Run("input through tasks/update", func(t *testing.T) {
		id := createTask(t, base, alice, "tk__confirm_delete", `{"filename":"deploy"}`)
		a := awaitStatus(t, base, alice, id, "input_required")
		var reqs map[string]struct{ Method string }
		json.Unmarshal(a.Result["inputRequests"], &reqs)
		var key string
		for k, r := range reqs {
			if r.Method == "elicitation/create" {
				key = k
			}
		}
		if len(reqs) != 1 || key == "" {
			t.Fatalf("input_required without the upstream's request: %s", a.Raw)
		}
		wantNotFound(t, "bob's tasks/update", post2026(t, base, bob, "tasks/update", id,
			fmt.Sprintf(`"taskId":%q,"inputResponses":{%q:{"action":"accept","content":{"ok":false}}},%s`, id, key, metaTasks)))
		if a := taskGet(t, base, alice, id, metaTasks); a.str("status") != "input_required" {
			t.Fatalf("bob's answer reached the task: %s", a.Raw)
		}
		u := post2026(t, base, alice, "tasks/update", id, fmt.Sprintf(`"taskId":%q,"inputResponses":{%q:{"action":"accept","content":{"ok":true}}},%s`, id, key, metaTasks))
		if u.Status != 200 || u.Error != nil || u.str("resultType") != "complete" {
			t.Fatalf("tasks/update: %d %s", u.Status, u.Raw)
		}
		a = awaitStatus(t, base, alice, id, "completed")
		if !strings.Contains(string(a.Result["result"]), `confirmed deploy: {\"ok\":true}`) {
			t.Fatalf("the answer did not reach the upstream: %s", a.Raw)
		}
	})

	t.Run("a failed task carries its error", func(t *testing.T) {
		id := createTask(t, base, alice, "tk__protocol_error_job", `{}`)
		a := awaitStatus(t, base, alice, id, "failed")
		if !strings.Contains(string(a.Result["error"]), `"code":-32603`) {
			t.Fatalf("failed without its error: %s", a.Raw)
		}
		id = createTask(t, base, alice, "tk__failing_job", `{}`)
		a = awaitStatus(t, base, alice, id, "completed")
		if !strings.Contains(string(a.Result["result"]), `"isError":true`) {
			t.Fatalf("a tool error is a completed task with isError: %s", a.Raw)
		}
	})

	t.Run("without the extension declared", func(t *testing.T) {
		id := createTask(t, base, alice, "tk__slow_compute", `{"seconds":0,"label":"x"}`)
		for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
			a := post2026(t, base, alice, m, id, fmt.Sprintf(`"taskId":%q,"inputResponses":{},%s`, id, metaPlain))
			if a.Status != http.StatusBadRequest || a.Error == nil || a.Error.Code != -32021 ||
				!strings.Contains(string(a.Error.Data), `"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}`) {
				t.Errorf("%s without the extension: want 400 -32021 naming it, got %d %s", m, a.Status, a.Raw)
			}
		}
		a := post2026(t, base, alice, "tools/call", "tk__slow_compute", `"name":"tk__slow_compute","arguments":{"seconds":0,"label":"sync"},`+metaPlain)
		if a.str("resultType") == "task" || a.Result["taskId"] != nil || !strings.Contains(string(a.Result["content"]), "computed sync") {
			t.Errorf("a call not declaring tasks must run synchronously: %s", a.Raw)
		}
		// Task notifications asked for without the extension (SEP-2663).
		a = post2026(t, base, alice, "subscriptions/listen", "", fmt.Sprintf(`"notifications":{"taskIds":[%q]},%s`, id, metaPlain))
		if a.Status != http.StatusBadRequest || a.Error == nil || a.Error.Code != -32021 {
			t.Errorf("subscriptions/listen for task ids without the extension: want 400 -32021, got %d %s", a.Status, a.Raw)
		}
		// tasks/result was the 2025-11-25 experiment's; it is no method here.
		if a := post2026(t, base, alice, "tasks/result", id, fmt.Sprintf(`"taskId":%q,%s`, id, metaTasks)); a.Status != http.StatusNotFound || a.Error == nil || a.Error.Code != -32601 {
			t.Errorf("tasks/result: want 404 -32601, got %d %s", a.Status, a.Raw)
		}
	})

	t.Run("not on 2025-11-25", func(t *testing.T) {
		// The extension is not defined there: a session's tools/call that
		// declares it anyway is not a task, and the task methods are none
		// of capgate's (it offers no 2025-11-25 experimental tasks).
		id := createTask(t, base, alice, "tk__slow_compute", `{"seconds":0,"label":"s"}`)
		sid := testkit.OpenSession(t, base, alice, `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`)
		st, _, b := testkit.PostSession(t, base, alice, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tk__slow_compute","arguments":{"seconds":0,"label":"old"}}}`)
		if st != http.StatusOK || !strings.Contains(string(b), "computed old") || strings.Contains(string(b), "taskId") {
			t.Errorf("a 2025-11-25 call: %d %s", st, b)
		}
		for _, m := range []string{"tasks/get", "tasks/cancel", "tasks/result", "tasks/list"} {
			st, _, b := testkit.PostSession(t, base, alice, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":%q,"params":{"taskId":%q}}`, m, id))
			if !strings.Contains(string(b), `"code":-32601`) || strings.Contains(string(b), `"result"`) {
				t.Errorf("%s in a 2025-11-25 session: want -32601, got %d %s", m, st, b)
			}
		}
	})

	t.Run("audited", func(t *testing.T) {
		var denied, allowed bool
		var b []byte
		testkit.Poll(10*time.Second, func() bool {
			b, _ = os.ReadFile(filepath.Join(cg.Dir, "data", "audit.jsonl"))
			denied, allowed = false, false
			for _, line := range strings.Split(string(b), "\n") {
				var e struct{ Type, Sub, Tool, Decision, Code, Detail string }
				if json.Unmarshal([]byte(line), &e) != nil || e.Type != "task" {
					continue
				}
				denied = denied || (e.Sub == "bob" && e.Decision == "deny" && e.Code == "capability_not_found")
				allowed = allowed || (e.Sub == "alice" && e.Decision == "allow" && e.Tool == "mcp:tk:slow_compute" && e.Detail == "tasks/get")
			}
			return denied && allowed
		})
		if !denied || !allowed {
			t.Fatalf("audit: bob's refusals recorded %v, alice's tasks/get %v:\n%s", denied, allowed, b)
		}
	})
}

// TestTasksWithoutUpstreamSupport: no upstream offers the extension, so
// capgate does not advertise it and its methods are ones this server does
// not have (404, -32601), declared or not.
func TestTasksWithoutUpstreamSupport(t *testing.T) {
	t.Parallel()
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q
`, testkit.Build(t, testkit.MCPFixture))})
	alice := cg.Token(t, token.Claims{Sub: "alice"})
	if a := post2026(t, cg.URL, alice, "server/discover", "", metaPlain); a.Status != 200 || strings.Contains(a.Raw, "io.modelcontextprotocol/tasks") {
		t.Fatalf("server/discover without a tasks upstream: %d %s", a.Status, a.Raw)
	}
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		for _, meta := range []string{metaTasks, metaPlain} {
			a := post2026(t, cg.URL, alice, m, "t1", `"taskId":"t1","inputResponses":{},`+meta)
			if a.Status != http.StatusNotFound || a.Error == nil || a.Error.Code != -32601 {
				t.Errorf("%s: want 404 -32601, got %d %s", m, a.Status, a.Raw)
			}
		}
	}
}

// startTaskReplicas starts two capgate replicas, r1 and r2, over the tasks
// fixture at fx, sharing the PostgreSQL database at db.
func startTaskReplicas(t *testing.T, fx, db string) (r1, r2 *testkit.Served) {
	t.Helper()
	const secret = "tasks-replicas-secret-0123456789ab"
	env := []string{"CAPGATE_STORE_KEY=" + strings.Repeat("7c", 32)}
	cfg := tasksConfig(fx) + fmt.Sprintf("\n[store]\nurl = %q\n", db)
	var reps [2]*testkit.Served
	for i, name := range []string{"r1", "r2"} {
		reps[i] = testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Env: env,
			Server: fmt.Sprintf("replica_id = %q\nadvertise_url = \"http://%s\"", name, testkit.AddrHere), Config: cfg})
	}
	return reps[0], reps[1]
}

// TestTasksReplicas: two replicas on one PostgreSQL; a task made through
// one is polled, cancelled and refused to another caller through the
// other (its owner is in the shared store).
func TestTasksReplicas(t *testing.T) {
	t.Parallel()
	r1, r2 := startTaskReplicas(t, startTasksFixture(t), pgtest.Start(t))
	alice := r1.Token(t, token.Claims{Sub: "alice"})
	bob := r1.Token(t, token.Claims{Sub: "bob"})

	id := createTask(t, r1.URL, alice, "tk__slow_compute", `{"seconds":30,"label":"r"}`)
	if a := taskGet(t, r2.URL, alice, id, metaTasks); a.Status != 200 || a.str("status") != "working" || a.str("taskId") != id {
		t.Fatalf("tasks/get on the other replica: %d %s", a.Status, a.Raw)
	}
	wantNotFound(t, "bob on the other replica", taskGet(t, r2.URL, bob, id, metaTasks))
	if a := post2026(t, r2.URL, alice, "tasks/cancel", id, fmt.Sprintf(`"taskId":%q,%s`, id, metaTasks)); a.Status != 200 || a.Error != nil {
		t.Fatalf("tasks/cancel on the other replica: %d %s", a.Status, a.Raw)
	}
	awaitStatus(t, r1.URL, alice, id, "cancelled")

	// A call that asks for input first (a multi round-trip request), whose
	// second round goes to the other replica, where the upstream makes it
	// a task: the replica holding the call records it, and both serve it.
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{},"extensions":{"io.modelcontextprotocol/tasks":{}}}}`
	a := post2026(t, r1.URL, alice, "tools/call", "tk__test_tool_with_task", `"name":"tk__test_tool_with_task","arguments":{},`+meta)
	var asks map[string]json.RawMessage
	json.Unmarshal(a.Result["inputRequests"], &asks)
	if a.str("resultType") != "input_required" || len(asks) != 1 || a.str("requestState") == "" {
		t.Fatalf("round 1 on r1: want one input request and a requestState, got %s", a.Raw)
	}
	var key string
	for k := range asks {
		key = k
	}
	a = post2026(t, r2.URL, alice, "tools/call", "tk__test_tool_with_task", fmt.Sprintf(
		`"name":"tk__test_tool_with_task","arguments":{},"inputResponses":{%q:{"action":"accept","content":{"name":"Alice"}}},"requestState":%q,%s`,
		key, a.str("requestState"), meta))
	id = a.str("taskId")
	if a.str("resultType") != "task" || !strings.HasPrefix(id, "cgt_") {
		t.Fatalf("round 2 on r2: want a task under capgate's id, got %s", a.Raw)
	}
	if a := awaitStatus(t, r2.URL, alice, id, "completed"); !strings.Contains(string(a.Result["result"]), "Hello, Alice") {
		t.Fatalf("the task's result: %s", a.Raw)
	}
	wantNotFound(t, "bob's tasks/get of the task made across replicas", taskGet(t, r1.URL, bob, id, metaTasks))
}
