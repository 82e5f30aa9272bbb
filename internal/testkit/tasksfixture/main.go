// Command tasksfixture is an upstream MCP server, on mcp-go, that offers
// the tasks extension (io.modelcontextprotocol/tasks, SEP-2663) on protocol
// 2026-07-28, for capgate's tests of relaying it. mcp-go v1.2.1 serves
// server/discover, tools/list and plain calls, and declares the extension;
// mcp-go implements only 2025-11-25's experimental tasks, so the
// extension's part (a task-augmented tools/call, tasks/get, tasks/update,
// tasks/cancel) is answered here, per the specification:
//
//   - greet: never a task, "Hello, NAME!".
//   - slow_compute {seconds, label}: a task when the request's client
//     capabilities declare the extension (else it runs synchronously),
//     completed after seconds with the text "computed LABEL".
//   - confirm_job {label}: a task that asks for input (input_required with
//     an elicitation under key "confirm"), then completes with the
//     answer's content as text, once tasks/update brings it.
//   - failing_job: a task that fails with JSON-RPC error -32603.
//
// Task methods without the extension declared on the request answer
// -32021; an unknown task id -32602. Every task method's Mcp-Name header
// must equal its taskId (else -32020, HeaderMismatch). It serves
// streamable HTTP at /mcp on -http ADDR.
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
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

const tasksExt = "io.modelcontextprotocol/tasks"

func main() {
	addr := flag.String("http", "127.0.0.1:0", "serve streamable HTTP at /mcp on this address")
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
	s.AddTool(mcp.NewTool("confirm_job", mcp.WithDescription("A task that asks for confirmation."), mcp.WithString("label")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("confirm_job runs only as a task"), nil
		})
	s.AddTool(mcp.NewTool("failing_job", mcp.WithDescription("A task that fails.")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("failing_job runs only as a task"), nil
		})
	t := &tasks{byID: map[string]*task{}, next: server.NewStreamableHTTPServer(s)}
	mux := http.NewServeMux()
	mux.Handle("/mcp", t)
	log.Fatal(http.ListenAndServe(*addr, mux))
}

// task is one task's state, as tasks/get shows it.
type task struct {
	ID, Status, Created, Updated string
	Result, Error, InputRequests json.RawMessage
	label                        string
}

type tasks struct {
	mu   sync.Mutex
	byID map[string]*task
	next http.Handler
}

type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Name           string                     `json:"name"`
		Arguments      map[string]any             `json:"arguments"`
		TaskID         string                     `json:"taskId"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
		Meta           struct {
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
		if !declared || req.Params.Name == "greet" {
			ts.next.ServeHTTP(w, r)
			return
		}
		t := ts.create(req)
		if t == nil {
			ts.next.ServeHTTP(w, r)
			return
		}
		answer(w, req.ID, ts.view(t, "task"))
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
	var b [16]byte
	rand.Read(b[:])
	t := &task{ID: hex.EncodeToString(b[:]), Status: "working", Created: now, Updated: now}
	t.label, _ = req.Params.Arguments["label"].(string)
	switch req.Params.Name {
	case "slow_compute":
		secs, _ := req.Params.Arguments["seconds"].(float64)
		time.AfterFunc(time.Duration(secs*float64(time.Second)), func() {
			res, _ := json.Marshal(mcp.NewToolResultText("computed " + t.label))
			ts.settle(t, "completed", res, nil)
		})
	case "confirm_job":
		t.Status = "input_required"
		t.InputRequests = json.RawMessage(`{"confirm":{"method":"elicitation/create","params":{"mode":"form","message":"Go ahead?","requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}}}}}}`)
	case "failing_job":
		time.AfterFunc(50*time.Millisecond, func() {
			ts.settle(t, "failed", nil, json.RawMessage(`{"code":-32603,"message":"the job failed"}`))
		})
	default:
		return nil
	}
	ts.mu.Lock()
	ts.byID[t.ID] = t
	ts.mu.Unlock()
	return t
}

// update takes the answer to confirm_job's request.
func (ts *tasks) update(t *task, responses map[string]json.RawMessage) {
	ts.mu.Lock()
	ans, ok := responses["confirm"]
	waiting := t.Status == "input_required"
	ts.mu.Unlock()
	if !ok || !waiting {
		return // a key not outstanding is ignored
	}
	var a struct {
		Content json.RawMessage `json:"content"`
	}
	json.Unmarshal(ans, &a)
	res, _ := json.Marshal(mcp.NewToolResultText("confirmed " + t.label + ": " + string(a.Content)))
	ts.settle(t, "completed", res, nil)
}

// settle moves t to a terminal status, unless it is in one.
func (ts *tasks) settle(t *task, status string, result, rpcErr json.RawMessage) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t.Status == "completed" || t.Status == "failed" || t.Status == "cancelled" {
		return
	}
	t.Status, t.Result, t.Error, t.InputRequests, t.Updated = status, result, rpcErr, nil, stamp()
}

// view is t as a result of resultType rt.
func (ts *tasks) view(t *task, rt string) map[string]any {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	v := map[string]any{"resultType": rt, "taskId": t.ID, "status": t.Status, "createdAt": t.Created,
		"lastUpdatedAt": t.Updated, "ttlMs": 600000, "pollIntervalMs": 50}
	if t.Result != nil {
		v["result"] = t.Result
	}
	if t.Error != nil {
		v["error"] = t.Error
	}
	if t.InputRequests != nil {
		v["inputRequests"] = t.InputRequests
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
