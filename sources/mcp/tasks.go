package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

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

var _ tool.TaskListener = (*Source)(nil)

// streamSinkKey marks a stream read for a listener of its own
// (ListenTasks): its notifications go to the sink, not to OnNotification,
// which serves every caller.
type streamSinkKey struct{}

type streamSink func(method string, params json.RawMessage)

// ListenTasks keeps a subscriptions/listen stream open at the upstream, as
// ctx's caller (its hook headers, the tasks extension declared), for the
// status notifications of the upstream's tasks ids. Each acknowledgement
// goes to acked with the ids the upstream agreed to; each
// notifications/tasks on the stream, as it came, to on. The stream is the
// caller's alone: capgate opens one per listening caller, so one caller's
// notifications never come on another's. A stream the upstream ends is
// opened again, after a pause that doubles while streams keep ending;
// ListenTasks returns when ctx ends, or with the error of an upstream
// that refuses the stream.
func (s *Source) ListenTasks(ctx context.Context, ids []string, acked func(agreed []string), on func(params json.RawMessage)) error {
	ctx, err := s.withHeaders(ctx, nil)
	if err != nil {
		return err
	}
	ctx = context.WithValue(withTasks(ctx), streamSinkKey{}, streamSink(func(method string, params json.RawMessage) {
		switch method {
		case "notifications/tasks":
			on(params)
		case string(mcpgo.MethodNotificationSubscriptionsAcknowledged):
			var p struct {
				Notifications struct {
					TaskIDs []string `json:"taskIds"`
				} `json:"notifications"`
			}
			json.Unmarshal(params, &p)
			acked(p.Notifications.TaskIDs)
		}
	}))
	wait := s.opts.MinBackoff
	for ctx.Err() == nil {
		start := time.Now()
		err := s.listenTasksOnce(ctx, ids)
		if ctx.Err() != nil {
			return nil
		}
		var te *tool.Error
		if errors.As(err, &te) {
			return err // refused: reopening would be refused again
		}
		s.opts.Logger.Debug("the upstream ended a task listen stream", "server", s.opts.Name, "err", err)
		if time.Since(start) > s.opts.MaxBackoff {
			wait = s.opts.MinBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(wait*2, s.opts.MaxBackoff)
	}
	return nil
}

// listenTasksOnce posts one subscriptions/listen for ids and reads its
// stream to the end. A refusal is a *tool.Error.
func (s *Source) listenTasksOnce(ctx context.Context, ids []string) error {
	l, err := s.linkFor(ctx)
	if err != nil {
		return err
	}
	if !offersTasks(l) {
		return tool.Errorf(tool.CodeBackendUnavailable, "mcp server %s offers no tasks now", s.opts.Name)
	}
	params, err := modernParams(ctx, map[string]any{"notifications": map[string]any{"taskIds": ids}})
	if err != nil {
		return tool.Wrap(err, tool.CodeInternal, "mcp server %s: subscriptions/listen: %v", s.opts.Name, err)
	}
	id := "capgate-" + strconv.FormatInt(s.seq.Add(1), 10)
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params})
	if err != nil {
		return tool.Wrap(err, tool.CodeInternal, "mcp server %s: subscriptions/listen: %v", s.opts.Name, err)
	}
	ctx = withMoreHeaders(ctx, standardHeaders("subscriptions/listen", params))
	ctx, resp, err := s.postAuthorized(ctx, l, body)
	var te *tool.Error
	if errors.As(err, &te) {
		return err // the Unauthorized hook's
	}
	if re := s.refusal("subscriptions/listen", err); re != nil {
		return re
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := readBody(resp, s.opts.MaxMessage)
		if err != nil {
			return err
		}
		if _, rpcErr, err := decodeResult(raw); err == nil && rpcErr != nil {
			return s.rpcError("subscriptions/listen", rpcErr.Code, rpcErr.Message, rpcErr.Data)
		}
		return errors.New("the upstream answered subscriptions/listen without a stream")
	}
	_, err = s.readStream(ctx, l, resp.Body, id, tool.Call{})
	return err
}
