package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/router"
	mcpsrc "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// The MCP tasks extension (SEP-2663) at the front door, on protocol
// 2026-07-28 (the extension exists on no other). capgate offers it while
// some upstream does: server/discover lists it, a tools/call whose client
// declares it may come back as a task (resultType "task", under capgate's
// own task id), and tasks/get, tasks/update and tasks/cancel are answered
// here through the router, which relays them to the task's upstream for
// the caller that made the task and tells anyone else it does not exist
// (router/task.go); a subscriptions/listen for task ids is served in
// tasklisten.go. While no upstream offers it, those methods reach
// mcp-go, which knows none of them: -32601, as for any server that does
// not declare the extension.

// taskMethods are the methods of the extension capgate relays. tasks/result
// and tasks/list (the 2025-11-25 experiment's) are not among them.
var taskMethods = map[string]bool{"tasks/get": true, "tasks/update": true, "tasks/cancel": true}

// offersTasks says whether some upstream of the catalog of now offers the
// tasks extension.
func (m *MCP) offersTasks() bool {
	for _, s := range m.reg().Sources() {
		if t, ok := s.(tool.Tasker); ok && t.OffersTasks() {
			return true
		}
	}
	return false
}

// discovered lists the tasks extension in server/discover's capabilities
// while some upstream offers it.
func (m *MCP) discovered(_ context.Context, _ any, _ *mcp.DiscoverRequest, res *mcp.DiscoverResult) {
	if res == nil || !m.offersTasks() {
		return
	}
	ext := make(map[string]any, len(res.Capabilities.Extensions)+1)
	for k, v := range res.Capabilities.Extensions {
		ext[k] = v
	}
	ext[tool.TasksExtension] = map[string]any{}
	res.Capabilities.Extensions = ext
}

// declaresTasks says whether a stateless request's _meta declares the
// tasks extension among its client's capabilities.
func declaresTasks(meta json.RawMessage) bool {
	var m struct {
		Caps *struct {
			Extensions map[string]json.RawMessage `json:"extensions"`
		} `json:"io.modelcontextprotocol/clientCapabilities"`
	}
	if json.Unmarshal(meta, &m) != nil || m.Caps == nil {
		return false
	}
	v, ok := m.Caps.Extensions[tool.TasksExtension]
	return ok && string(v) != "null"
}

// callDeclaresTasks says whether the tools/call ctx serves declared the
// tasks extension (a stateless request: per request, never per session).
func callDeclaresTasks(ctx context.Context) bool {
	info := mcpserver.RequestProtocolInfoFromContext(ctx)
	if info == nil || !info.Modern || info.ClientCapabilities == nil {
		return false
	}
	_, ok := info.ClientCapabilities.Extensions[tool.TasksExtension]
	return ok
}

// methodOf is the JSON string v, as json.Unmarshal reads it. Every
// stateless POST passes taskMethod, tools/call above all: a string without
// escapes is its own value, read without json.Unmarshal's reflection
// (about 5 µs a call).
func methodOf(v []byte) (string, bool) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && plainBody(v[1:len(v)-1]) {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	return s, json.Unmarshal(v, &s) == nil
}

// plainBody says whether b is a JSON string's body that needs no decoding:
// valid UTF-8 with no escape, quote or control byte.
func plainBody(b []byte) bool {
	for _, c := range b {
		if c < ' ' || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(b)
}

// taskMethod serves r when it is a task method on the stateless protocol
// while some upstream offers tasks, or a subscriptions/listen asking for
// task notifications, and says whether it did.
func (m *MCP) taskMethod(w http.ResponseWriter, r *http.Request, p *posted) bool {
	if r.Header.Get(mcp.HeaderProtocolVersion) != modernProtocol {
		return false
	}
	top, ok := p.members()
	if !ok {
		return false
	}
	method, ok := methodOf(top[2])
	if !ok || !(taskMethods[method] || method == "subscriptions/listen") || !present(top[1]) || !m.offersTasks() {
		return false
	}
	id := json.RawMessage(top[1])
	var params map[string]json.RawMessage
	if present(top[3]) && json.Unmarshal(top[3], &params) != nil {
		if method == "subscriptions/listen" {
			return false // mcp-go's to refuse
		}
		writeRPCError(w, id, mcp.INVALID_PARAMS, method+": params are not an object", nil)
		return true
	}
	if method == "subscriptions/listen" {
		// Task status notifications: capgate serves the stream
		// (tasklisten.go); asking for them undeclared is an error
		// (SEP-2663).
		var n struct {
			TaskIDs []json.RawMessage `json:"taskIds"`
		}
		json.Unmarshal(params["notifications"], &n)
		if len(n.TaskIDs) == 0 {
			return false
		}
		if declaresTasks(params["_meta"]) {
			if got := r.Header.Get(mcp.HeaderMethod); got != method {
				writeRPCError(w, id, mcp.HEADER_MISMATCH, "Header mismatch: Mcp-Method "+strconv.Quote(got)+" is not the request's method", nil)
				return true
			}
			m.listenTasks(w, r, p.body, id, params)
			return true
		}
	}
	if !declaresTasks(params["_meta"]) {
		writeRPCError(w, id, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability", map[string]any{
			"requiredCapabilities": map[string]any{"extensions": map[string]any{tool.TasksExtension: map[string]any{}}}})
		return true
	}
	var taskID string
	if json.Unmarshal(params["taskId"], &taskID) != nil || taskID == "" {
		writeRPCError(w, id, mcp.INVALID_PARAMS, method+": params.taskId must be a non-empty string", nil)
		return true
	}
	// The routing headers must say what the body says (SEP-2243): a
	// balancer routes by them.
	if got := r.Header.Get(mcp.HeaderMethod); got != method {
		writeRPCError(w, id, mcp.HEADER_MISMATCH, "Header mismatch: Mcp-Method "+strconv.Quote(got)+" is not the request's method", nil)
		return true
	}
	if got := r.Header.Get(mcp.HeaderName); got != taskID {
		writeRPCError(w, id, mcp.HEADER_MISMATCH, "Header mismatch: Mcp-Name "+strconv.Quote(got)+" is not params.taskId", nil)
		return true
	}
	delete(params, "taskId")
	delete(params, "_meta")
	var rest json.RawMessage
	if len(params) > 0 {
		rest, _ = json.Marshal(params)
	}
	c := CallerFrom(r.Context())
	res, err := m.rt().Task(r.Context(), c, router.TaskRequest{Method: method, ID: taskID, Params: rest,
		Protocol: "mcp/" + modernProtocol})
	switch {
	case err == nil:
	case writeUpstreamError(w, id, err, true):
		return true
	case tool.ErrorCode(err) == tool.CodeNotFound:
		writeRPCError(w, id, mcp.INVALID_PARAMS, router.ErrTaskNotFound.Message, nil)
		return true
	default:
		writeRPCError(w, id, mcp.INTERNAL_ERROR, err.Error(), nil)
		return true
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(res, &fields) != nil {
		writeRPCError(w, id, mcp.INTERNAL_ERROR, method+": the upstream's result is not an object", nil)
		return true
	}
	// The standard result of each of these methods (SEP-2663).
	fields["resultType"] = json.RawMessage(`"complete"`)
	b, err := json.Marshal(struct {
		JSONRPC string                     `json:"jsonrpc"`
		ID      json.RawMessage            `json:"id"`
		Result  map[string]json.RawMessage `json:"result"`
	}{"2.0", id, fields})
	if err != nil {
		writeRPCError(w, id, mcp.INTERNAL_ERROR, method+": "+err.Error(), nil)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(append(b, '\n'))
	return true
}

// writeRPCError writes a JSON-RPC error answering id on the stateless
// protocol, with the HTTP status it prescribes for code.
func writeRPCError(w http.ResponseWriter, id json.RawMessage, code int, message string, data any) {
	status := http.StatusOK
	switch code {
	case mcp.METHOD_NOT_FOUND:
		status = http.StatusNotFound
	case mcp.INVALID_PARAMS, mcp.INVALID_REQUEST, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, mcp.HEADER_MISMATCH:
		status = http.StatusBadRequest
	}
	writeUpstreamError(w, id, &mcpsrc.RPCError{Code: code, Message: message, Data: data, Status: status}, true)
}

// taskCreated is a call's answer when it became a task: not an error, but
// mcp-go's tool handlers can return only a CallToolResult or an error, so
// it travels as one, and the request's response writer (passerror.go)
// writes the CreateTaskResult in place of the error mcp-go makes of it.
type taskCreated struct{ task json.RawMessage }

func (t *taskCreated) Error() string { return "the call became a task" }

// passTask records t for the request ctx serves, and says whether it did.
func passTask(ctx context.Context, err error) bool {
	var t *taskCreated
	e, _ := ctx.Value(errorPatchKey{}).(*errorPatch)
	if e == nil || !errors.As(err, &t) {
		return false
	}
	e.task.Store(&t.task)
	return true
}

// taskInvocation is a CreateTaskResult with the invocation that made the
// task in its _meta, as a call's result has it (withInvocation).
func taskInvocation(task json.RawMessage, inv router.Invocation) json.RawMessage {
	var fields map[string]json.RawMessage
	if json.Unmarshal(task, &fields) != nil {
		return task
	}
	meta := map[string]json.RawMessage{}
	if m, ok := fields["_meta"]; ok && json.Unmarshal(m, &meta) != nil {
		return task
	}
	meta["capgate/invocation_id"], _ = json.Marshal(inv.ID)
	fields["_meta"], _ = json.Marshal(meta)
	b, err := json.Marshal(fields)
	if err != nil {
		return task
	}
	return b
}
