package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"

	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/tool"
)

// The MCP tasks extension (SEP-2663) toward upstreams on the stateless
// protocol: an upstream that declares it in server/discover may answer a
// tools/call whose caller declared it with a task (resultType "task"),
// which the caller then follows with tasks/get, tasks/update and
// tasks/cancel. capgate declares the extension upstream only for callers
// that declared it, and relays the task methods as capgate's router asks
// (it keeps which caller owns which task; see router/task.go).

var _ tool.Tasker = (*Source)(nil)

// OffersTasks says whether the upstream declared the tasks extension on
// the protocol it speaks now (the extension exists on 2026-07-28 only).
func (s *Source) OffersTasks() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil && offersTasks(s.conn)
}

func offersTasks(l *link) bool {
	if !l.modern() || l.caps.Extensions == nil {
		return false
	}
	_, ok := l.caps.Extensions[tool.TasksExtension]
	return ok
}

// TaskRequest relays one task method for the upstream's task taskID.
func (s *Source) TaskRequest(ctx context.Context, method, taskID string, params json.RawMessage) (json.RawMessage, error) {
	if !strings.HasPrefix(method, "tasks/") {
		return nil, tool.Errorf(tool.CodeInternal, "mcp server %s: %s is not a task method", s.opts.Name, method)
	}
	fields := map[string]json.RawMessage{}
	if len(params) > 0 && string(params) != "null" {
		if err := json.Unmarshal(params, &fields); err != nil {
			return nil, tool.Errorf(tool.CodeInvalidInput, "%s: params are not a JSON object", method)
		}
	}
	id, _ := json.Marshal(taskID)
	fields["taskId"] = id
	return s.Request(withTasks(ctx), method, fields)
}

var taskIDName = []string{"taskId"}

// taskIDOf is params' taskId when method is a task method.
func taskIDOf(method string, params json.RawMessage) (string, bool) {
	if !strings.HasPrefix(method, "tasks/") {
		return "", false
	}
	var v [1][]byte
	var id string
	if !rawjson.Pick(params, taskIDName, v[:]) || v[0] == nil || json.Unmarshal(v[0], &id) != nil || id == "" {
		return "", false
	}
	return id, true
}

var resultTypeName = []string{"resultType"}

// taskResult is a tools/call response's result when it is a
// CreateTaskResult (resultType "task"), as the upstream sent it.
func taskResult(raw []byte) (json.RawMessage, bool) {
	if !bytes.Contains(raw, []byte(`"task"`)) {
		return nil, false
	}
	var msg [2][]byte
	var rt [1][]byte
	if !rawjson.Pick(raw, responseNames, msg[:]) || msg[0] == nil || msg[1] != nil ||
		!rawjson.Pick(msg[0], resultTypeName, rt[:]) || string(rt[0]) != `"task"` {
		return nil, false
	}
	return msg[0], true
}
