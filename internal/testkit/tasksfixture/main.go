// Command tasksfixture is an upstream MCP server, on mcp-go, that offers
// the tasks extension (io.modelcontextprotocol/tasks, SEP-2663) on protocol
// 2026-07-28, with the fixture tools the MCP conformance suite's tasks
// scenarios call, for capgate's tests of relaying it. mcp-go v1.2.1 serves
// server/discover, tools/list and plain calls, and declares the extension;
// mcp-go implements only 2025-11-25's experimental tasks, so the
// extension's part (a task-augmented tools/call, tasks/get, tasks/update,
// tasks/cancel) is answered here, per the specification:
//
//   - greet {name}: never a task, "Hello, NAME!".
//   - slow_compute {seconds, label}: a task when the request's client
//     capabilities declare the extension (else it runs synchronously),
//     completed after seconds with the text "computed LABEL".
//   - confirm_delete {filename}: a task that asks for input (input_required
//     with one elicitation), then completes with "confirmed FILENAME: " and
//     the answer's content, once tasks/update brings it.
//   - multi_input: a task with two elicitations pending at once; it stays
//     input_required until both are answered.
//   - failing_job: task support required (-32021 for a client that does
//     not declare the extension); completes with a tool error (isError).
//   - protocol_error_job: a task that fails with JSON-RPC error -32603.
//   - test_tool_with_task: a multi round-trip request first (an
//     input_required result asking for user_name), then, with the answer,
//     a task that completes with "Hello, NAME".
//
// Task methods without the extension declared on the request answer
// -32021; an unknown task id -32602. Every task method's Mcp-Name header
// must equal its taskId (else -32020, HeaderMismatch). A
// subscriptions/listen naming taskIds (the extension declared) is
// acknowledged with the ids the fixture knows, and carries a
// notifications/tasks with the task as tasks/get shows it at each change
// of its status; with -notify-all, a careless upstream, every listen
// stream gets every task's notifications, whatever ids it named. It
// serves streamable HTTP at /mcp on -http ADDR.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

const tasksExt = "io.modelcontextprotocol/tasks"

func main() {
	addr := flag.String("http", "127.0.0.1:0", "serve streamable HTTP at /mcp on this address")
	all := flag.Bool("notify-all", false, "send every task's status notifications on every task listen stream")
	flag.Parse()
	s := server.NewMCPServer("tasksfixture", "1",
		server.WithToolCapabilities(false),
		server.WithExtensions(map[string]any{tasksExt: map[string]any{}}))
	s.AddTool(mcp.NewTool("greet", mcp.WithDescription("Greets NAME."), mcp.WithString("name")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("Hello, " + req.GetString("name", "you") + "!"), nil
		})
	s.AddTool(mcp.NewTool("slow_compute", mcp.WithDescription("Computes for SECONDS; a task for clients that take one."),
		mcp.WithNumber("seconds"), mcp.WithString("label")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("computed " + req.GetString("label", "")), nil
		})
	for _, name := range []string{"confirm_delete", "multi_input", "failing_job", "protocol_error_job", "test_tool_with_task"} {
		s.AddTool(mcp.NewTool(name, mcp.WithDescription(name+": runs only as a task."), mcp.WithString("filename")),
			func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return mcp.NewToolResultError(name + " runs only as a task"), nil
			})
	}
	t := &tasks{byID: map[string]*task{}, next: server.NewStreamableHTTPServer(s), all: *all, listeners: map[*listener]bool{}}
	mux := http.NewServeMux()
	mux.Handle("/mcp", t)
	log.Fatal(http.ListenAndServe(*addr, mux))
}

// task is one task's state, as tasks/get shows it.
type task struct {
	ID, Status, Created, Updated string
	Result, Error                json.RawMessage
	pending                      map[string]json.RawMessage // input requests by key
	answers                      []string
	label                        string
}

type tasks struct {
	mu        sync.Mutex
	byID      map[string]*task
	next      http.Handler
	all       bool               // -notify-all
	listeners map[*listener]bool // the open task listen streams
}

// listener is one subscriptions/listen stream for task ids.
type listener struct {
	id  json.RawMessage // the listen request's id, in every message's _meta
	ids map[string]bool
	out chan []byte
}

type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Name           string                     `json:"name"`
		Arguments      map[string]any             `json:"arguments"`
		TaskID         string                     `json:"taskId"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
		Notifications  struct {
			TaskIDs []string `json:"taskIds"`
		} `json:"notifications"`
		Meta struct {
			Caps struct {
				Extensions map[string]json.RawMessage `json:"extensions"`
			} `json:"io.modelcontextprotocol/clientCapabilities"`
		} `json:"_meta"`
	} `json:"params"`
}

func (ts *tasks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		ts.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req request
	if json.Unmarshal(body, &req) != nil || req.ID == nil {
		ts.next.ServeHTTP(w, r)
		return
	}
	_, declared := req.Params.Meta.Caps.Extensions[tasksExt]
	switch req.Method {
	case "tools/call":
		name := req.Params.Name
		if name == "greet" || (name == "slow_compute" && !declared) {
			ts.next.ServeHTTP(w, r)
			return
		}
		if name == "test_tool_with_task" && req.Params.InputResponses["user_name"] == nil {
			answer(w, req.ID, map[string]any{"resultType": "input_required", "requestState": "round-1",
				"inputRequests": map[string]any{"user_name": elicit("Your name?")}})
			return
		}
		if !declared {
			fail(w, req.ID, http.StatusBadRequest, -32021, "Missing required client capability",
				map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasksExt: map[string]any{}}}})
			return
		}
		t := ts.create(req)
		if t == nil {
			ts.next.ServeHTTP(w, r)
			return
		}
		answer(w, req.ID, ts.view(t, "task"))
	case "subscriptions/listen":
		if len(req.Params.Notifications.TaskIDs) == 0 {
			ts.next.ServeHTTP(w, r)
			return
		}
		if !declared {
			fail(w, req.ID, http.StatusBadRequest, -32021, "Missing required client capability",
				map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasksExt: map[string]any{}}}})
			return
		}
		ts.listen(w, r, req)
	case "tasks/get", "tasks/update", "tasks/cancel":
		if !declared {
			fail(w, req.ID, http.StatusBadRequest, -32021, "Missing required client capability",
				map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasksExt: map[string]any{}}}})
			return
		}
		if got := r.Header.Get("Mcp-Name"); got != req.Params.TaskID {
			fail(w, req.ID, http.StatusBadRequest, -32020, fmt.Sprintf("Mcp-Name %q does not match params.taskId", got), nil)
			return
		}
		ts.mu.Lock()
		t := ts.byID[req.Params.TaskID]
		ts.mu.Unlock()
		if t == nil {
			fail(w, req.ID, http.StatusBadRequest, -32602, "Failed to retrieve task: Task not found", nil)
			return
		}
		switch req.Method {
		case "tasks/get":
			answer(w, req.ID, ts.view(t, "complete"))
		case "tasks/update":
			ts.update(t, req.Params.InputResponses)
			answer(w, req.ID, map[string]any{"resultType": "complete"})
		case "tasks/cancel":
			ts.settle(t, "cancelled", nil, nil)
			answer(w, req.ID, map[string]any{"resultType": "complete"})
		}
	default:
		ts.next.ServeHTTP(w, r)
	}
}

// create makes the task a tools/call asks for, or nil for a tool that
// makes none.
func (ts *tasks) create(req request) *task {
	now := stamp()
	t := &task{ID: newID(), Status: "working", Created: now, Updated: now, pending: map[string]json.RawMessage{}}
	t.label, _ = req.Params.Arguments["label"].(string)
	if f, ok := req.Params.Arguments["filename"].(string); ok {
		t.label = f
	}
	later := func(d time.Duration, status string, result, rpcErr json.RawMessage) {
		time.AfterFunc(d, func() { ts.settle(t, status, result, rpcErr) })
	}
	switch req.Params.Name {
	case "slow_compute":
		secs, _ := req.Params.Arguments["seconds"].(float64)
		later(time.Duration(secs*float64(time.Second)), "completed", text("computed "+t.label, false), nil)
	case "confirm_delete":
		t.Status = "input_required"
		t.pending["confirm-"+newID()[:8]] = elicit("Delete " + t.label + "?")
	case "multi_input":
		t.Status = "input_required"
		t.pending["first-"+newID()[:8]] = elicit("First?")
		t.pending["second-"+newID()[:8]] = elicit("Second?")
	case "failing_job":
		later(50*time.Millisecond, "completed", text("the job reported an error", true), nil)
	case "protocol_error_job":
		later(50*time.Millisecond, "failed", nil, json.RawMessage(`{"code":-32603,"message":"the job failed"}`))
	case "test_tool_with_task":
		var a struct {
			Content struct {
				Name string `json:"name"`
			} `json:"content"`
		}
		json.Unmarshal(req.Params.InputResponses["user_name"], &a)
		later(50*time.Millisecond, "completed", text("Hello, "+a.Content.Name, false), nil)
	default:
		return nil
	}
	ts.mu.Lock()
	ts.byID[t.ID] = t
	ts.mu.Unlock()
	return t
}

// update takes answers to t's pending requests; keys not pending are
// ignored. The task completes once none is left.
func (ts *tasks) update(t *task, responses map[string]json.RawMessage) {
	ts.mu.Lock()
	for k, v := range responses {
		if _, ok := t.pending[k]; ok && t.Status == "input_required" {
			delete(t.pending, k)
			var a struct {
				Content json.RawMessage `json:"content"`
			}
			json.Unmarshal(v, &a)
			t.answers = append(t.answers, string(a.Content))
		}
	}
	done := t.Status == "input_required" && len(t.pending) == 0
	answers := strings.Join(t.answers, ", ")
	t.Updated = stamp()
	ts.mu.Unlock()
	if done {
		ts.settle(t, "completed", text("confirmed "+t.label+": "+answers, false), nil)
	}
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func elicit(msg string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"method": "elicitation/create", "params": map[string]any{"mode": "form", "message": msg,
		"requestedSchema": map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}}})
	return b
}

func text(s string, isError bool) json.RawMessage {
	r := mcp.NewToolResultText(s)
	r.IsError = isError
	b, _ := json.Marshal(r)
	return b
}

// settle moves t to a terminal status, unless it is in one, and tells
// the listeners.
func (ts *tasks) settle(t *task, status string, result, rpcErr json.RawMessage) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t.Status == "completed" || t.Status == "failed" || t.Status == "cancelled" {
		return
	}
	t.Status, t.Result, t.Error, t.pending, t.Updated = status, result, rpcErr, nil, stamp()
	ts.notify(t)
}

// notify sends t's status to the listen streams that asked for it (all
// of them with -notify-all); ts.mu is held.
func (ts *tasks) notify(t *task) {
	for l := range ts.listeners {
		if !ts.all && !l.ids[t.ID] {
			continue
		}
		params := ts.detail(t)
		params["_meta"] = map[string]any{"io.modelcontextprotocol/subscriptionId": l.id}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/tasks", "params": params})
		select {
		case l.out <- b:
		default: // a stream that does not keep up misses it; tasks/get still has it
		}
	}
}

// listen serves a subscriptions/listen stream for task ids: the
// acknowledgement names those it knows, then their notifications come
// until the client goes.
func (ts *tasks) listen(w http.ResponseWriter, r *http.Request, req request) {
	l := &listener{id: req.ID, ids: map[string]bool{}, out: make(chan []byte, 64)}
	agreed := []string{}
	ts.mu.Lock()
	for _, id := range req.Params.Notifications.TaskIDs {
		if ts.byID[id] != nil && !l.ids[id] {
			l.ids[id] = true
			agreed = append(agreed, id)
		}
	}
	ts.listeners[l] = true
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		delete(ts.listeners, l)
		ts.mu.Unlock()
	}()
	ack, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
		"params": map[string]any{"_meta": map[string]any{"io.modelcontextprotocol/subscriptionId": req.ID},
			"notifications": map[string]any{"taskIds": agreed}}})
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for msg := ack; ; {
		if _, err := fmt.Fprintf(w, "event: message\ndata: %s\n\n", msg); err != nil || rc.Flush() != nil {
			return
		}
		select {
		case msg = <-l.out:
		case <-r.Context().Done():
			return
		}
	}
}

// view is t as a result of resultType rt.
func (ts *tasks) view(t *task, rt string) map[string]any {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	v := ts.detail(t)
	v["resultType"] = rt
	return v
}

// detail is t as tasks/get shows it, without resultType; ts.mu is held.
func (ts *tasks) detail(t *task) map[string]any {
	v := map[string]any{"taskId": t.ID, "status": t.Status, "createdAt": t.Created,
		"lastUpdatedAt": t.Updated, "ttlMs": 600000, "pollIntervalMs": 50}
	if t.Result != nil {
		v["result"] = t.Result
	}
	if t.Error != nil {
		v["error"] = t.Error
	}
	if len(t.pending) > 0 {
		v["inputRequests"] = t.pending
	}
	return v
}

func stamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

func answer(w http.ResponseWriter, id json.RawMessage, result any) {
	write(w, http.StatusOK, map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func fail(w http.ResponseWriter, id json.RawMessage, status, code int, msg string, data any) {
	e := map[string]any{"code": code, "message": msg}
	if data != nil {
		e["data"] = data
	}
	write(w, status, map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
}

func write(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
