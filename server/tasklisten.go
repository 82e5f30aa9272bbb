package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// Task status notifications (SEP-2663): a 2026-07-28 caller that declares
// the tasks extension names task ids in a subscriptions/listen, and gets
// notifications/tasks for those that are its own on that stream. capgate
// serves such a stream itself (mcp-go's listen knows no task ids): the
// router keeps the ids the caller may hear of (its own, of a tool it may
// still call; router.WatchTasks), and for each source of them capgate
// opens a listen stream of the caller's own at the upstream, under the
// upstream's ids (tool.TaskListener). What comes back is renamed to
// capgate's ids and passed on, only for the tasks this stream asked for.
// The store the replicas share says whose a task is, so a task made
// through one replica is heard through any other: each listens at the
// upstream over its own link. The acknowledgement agrees to the ids whose
// upstream agreed within ackWait. A listen naming task ids is answered
// for task ids alone: list changes and resource subscriptions asked for
// in the same request are not agreed to (the acknowledgement says so),
// and a client asks for them on a listen of their own.

// maxListenTasks bounds the task ids of one subscriptions/listen.
const maxListenTasks = 100

// ackWait bounds how long capgate waits for the upstreams to acknowledge
// before it acknowledges what they agreed to by then.
const ackWait = 10 * time.Second

// listenTasks serves a subscriptions/listen for the task ids in params
// (the extension declared).
func (m *MCP) listenTasks(w http.ResponseWriter, r *http.Request, id json.RawMessage, params map[string]json.RawMessage) {
	var n struct {
		TaskIDs []string `json:"taskIds"`
	}
	if err := json.Unmarshal(params["notifications"], &n); err != nil {
		writeRPCError(w, id, mcp.INVALID_PARAMS, "subscriptions/listen: params.notifications.taskIds must be an array of strings", nil)
		return
	}
	if len(n.TaskIDs) > maxListenTasks {
		writeRPCError(w, id, mcp.INVALID_PARAMS, "subscriptions/listen: more than 100 taskIds", nil)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c := CallerFrom(ctx)
	watches, err := m.rt().WatchTasks(ctx, c, n.TaskIDs, "mcp/"+modernProtocol)
	if err != nil {
		writeRPCError(w, id, mcp.INTERNAL_ERROR, "subscriptions/listen: "+tool.ErrorMessage(err), nil)
		return
	}

	// One upstream stream per source, the caller's alone.
	bySource := map[tool.TaskListener]map[string]router.TaskWatch{}
	for _, tw := range watches {
		if bySource[tw.Source] == nil {
			bySource[tw.Source] = map[string]router.TaskWatch{}
		}
		bySource[tw.Source][tw.UpstreamID] = tw
	}
	out := make(chan json.RawMessage)
	var (
		mu     sync.Mutex
		agreed []string
		wg     sync.WaitGroup
	)
	acks := make(chan struct{}, len(bySource))
	for src, tasks := range bySource {
		ids := make([]string, 0, len(tasks))
		for up := range tasks {
			ids = append(ids, up)
		}
		var once sync.Once
		acked := func(ok []string) {
			once.Do(func() {
				mu.Lock()
				for _, up := range ok {
					if tw, mine := tasks[up]; mine {
						agreed = append(agreed, tw.ID)
					}
				}
				mu.Unlock()
				acks <- struct{}{}
			})
		}
		on := func(raw json.RawMessage) {
			// Only the tasks this stream asked for, whatever the upstream
			// sends on it.
			var p struct {
				TaskID string `json:"taskId"`
			}
			if json.Unmarshal(raw, &p) != nil {
				return
			}
			tw, mine := tasks[p.TaskID]
			if !mine {
				return
			}
			notice, ok := m.rt().TaskNotice(c, tw, raw)
			if !ok {
				return
			}
			select {
			case out <- notice:
			case <-ctx.Done():
			}
		}
		wg.Go(func() {
			// An upstream that refuses, or goes before acknowledging, agreed
			// to nothing.
			_ = src.ListenTasks(ctx, ids, acked, on)
			acked(nil)
		})
	}
	defer wg.Wait()
	defer cancel()

	timer := time.NewTimer(ackWait)
	for waiting := len(bySource); waiting > 0; {
		select {
		case <-acks:
			waiting--
		case <-timer.C:
			waiting = 0
		case <-ctx.Done():
			return
		}
	}
	timer.Stop()
	mu.Lock()
	ids := append([]string{}, agreed...)
	mu.Unlock()

	sub := map[string]json.RawMessage{mcp.MetaKeySubscriptionID: id}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(msg any) bool {
		b, err := json.Marshal(msg)
		if err != nil {
			return false
		}
		ev := make([]byte, 0, len(b)+32)
		ev = append(ev, "event: message\ndata: "...)
		ev = append(ev, b...)
		ev = append(ev, "\n\n"...)
		if _, err := w.Write(ev); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send(map[string]any{"jsonrpc": "2.0", "method": mcp.MethodNotificationSubscriptionsAcknowledged,
		"params": map[string]any{"_meta": sub, "notifications": map[string]any{"taskIds": ids}}}) {
		return
	}
	if len(ids) == 0 {
		// Nothing to tell of: the stream ends, as for an empty filter.
		send(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]any{"_meta": sub, "resultType": "complete"}})
		return
	}
	for {
		select {
		case notice := <-out:
			var params map[string]json.RawMessage
			if json.Unmarshal(notice, &params) != nil {
				continue
			}
			params["_meta"], _ = json.Marshal(sub)
			if !send(map[string]any{"jsonrpc": "2.0", "method": "notifications/tasks", "params": params}) {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
