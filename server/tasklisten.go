package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

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
// upstream agreed within ackWait.
//
// Resource updates (resourceSubscriptions, on any 2026-07-28 listen):
// mcp-go would agree to every URI and deliver nothing (its listen session
// is not one capgate's relay can reach), so capgate serves them too. A
// URI is agreed to when the relay serves it and the caller may read it
// (what gates resources/read); it is subscribed for this stream alone in
// the relay, as a session's resources/subscribe is (relay.go: the first
// subscriber subscribes upstream, the last to leave unsubscribes), and
// its updates come on this stream only, while the caller may still read
// it. A listen that also asks for list changes is served by mcp-go as
// any other, without the task ids and resources: capgate adds what it
// agreed to to mcp-go's acknowledgement (ackWriter) and puts its
// notifications into the listen's session after it, where mcp-go writes
// them in turn with its own (heldListen).

// maxListenTasks bounds the task ids of one subscriptions/listen, and
// its resource URIs.
const maxListenTasks = 100

// ackWait bounds how long capgate waits for the upstreams to acknowledge
// before it acknowledges what they agreed to by then.
const ackWait = 10 * time.Second

// listenNotice is one notification for a listen's stream.
type listenNotice struct {
	method string
	params json.RawMessage
}

// listen serves a subscriptions/listen for the task ids in params (when
// withTasks: the extension declared) and its resource subscriptions.
func (m *MCP) listen(w http.ResponseWriter, r *http.Request, body []byte, id json.RawMessage, params map[string]json.RawMessage, withTasks bool) {
	var n struct {
		TaskIDs   []string `json:"taskIds"`
		Resources []string `json:"resourceSubscriptions"`
	}
	var others mcp.SubscriptionFilter // what else the listen asks for
	if err := json.Unmarshal(params["notifications"], &n); err != nil || json.Unmarshal(params["notifications"], &others) != nil {
		writeRPCError(w, id, mcp.INVALID_PARAMS, "subscriptions/listen: params.notifications is not a filter (taskIds and resourceSubscriptions must be arrays of strings)", nil)
		return
	}
	others.ResourceSubscriptions = nil // capgate's, below
	if !withTasks {
		n.TaskIDs = nil
	}
	if len(n.TaskIDs) > maxListenTasks {
		writeRPCError(w, id, mcp.INVALID_PARAMS, "subscriptions/listen: more than 100 taskIds", nil)
		return
	}
	if len(n.Resources) > maxListenTasks {
		writeRPCError(w, id, mcp.INVALID_PARAMS, "subscriptions/listen: more than 100 resourceSubscriptions", nil)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c := CallerFrom(ctx)
	var watches []router.TaskWatch
	if len(n.TaskIDs) > 0 {
		var err error
		if watches, err = m.rt().WatchTasks(ctx, c, n.TaskIDs, "mcp/"+modernProtocol); err != nil {
			writeRPCError(w, id, mcp.INTERNAL_ERROR, "subscriptions/listen: "+tool.ErrorMessage(err), nil)
			return
		}
	}
	out := make(chan listenNotice)

	// The resources: subscribed as resources/subscribe does for a session,
	// under a key of this stream's own, until it ends; their updates
	// coalesce in pending, so the upstream's reader never waits for the
	// caller.
	var resources []string
	if len(n.Resources) > 0 {
		key := "listen/" + rand.Text()
		pending := &pendingURIs{ready: make(chan struct{}, 1)}
		resources = m.listenResources(ctx, key, c, n.Resources, pending.add)
		defer func() {
			for _, uri := range resources {
				m.unsubscribe(key, uri)
			}
		}()
		go pending.pass(ctx, out)
	}

	// One upstream stream per source, the caller's alone.
	bySource := map[tool.TaskListener]map[string]router.TaskWatch{}
	for _, tw := range watches {
		if bySource[tw.Source] == nil {
			bySource[tw.Source] = map[string]router.TaskWatch{}
		}
		bySource[tw.Source][tw.UpstreamID] = tw
	}
	upCtx, upCancel := context.WithCancel(ctx) // the upstream listens
	defer upCancel()
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
			case out <- listenNotice{"notifications/tasks", notice}:
			case <-ctx.Done():
			}
		}
		wg.Go(func() {
			// An upstream that refuses, or goes before acknowledging, agreed
			// to nothing.
			_ = src.ListenTasks(upCtx, ids, acked, on)
			acked(nil)
		})
	}
	defer wg.Wait()
	defer cancel()
	// When no upstream listens any more (each refused, or its source went
	// with a reload and could not reopen), the stream ends, so that the
	// client listens again; a stream with resources subscribed lasts.
	gone := make(chan struct{})
	go func(gone chan struct{}) {
		wg.Wait()
		close(gone)
	}(gone)

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
	var ids []string // nil when the listen named no task ids
	if len(n.TaskIDs) > 0 {
		ids = append([]string{}, agreed...)
	}
	mu.Unlock()
	if len(ids) == 0 {
		upCancel() // nothing agreed: nothing to hear upstream
	}
	if len(resources) > 0 {
		gone = nil
	}
	ack := map[string]any{}
	if ids != nil {
		ack["taskIds"] = ids
	}
	if len(resources) > 0 {
		ack["resourceSubscriptions"] = resources
	}

	if !others.IsEmpty() {
		// mcp-go serves what it knows, capgate declaring every kind.
		if len(ids) == 0 && len(resources) == 0 {
			gone = nil // the stream is mcp-go's to end
		}
		m.listenWithMCP(w, r.WithContext(ctx), body, params, ack, out, gone)
		return
	}
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
		if _, err := w.Write(sseMessage(b)); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send(map[string]any{"jsonrpc": "2.0", "method": mcp.MethodNotificationSubscriptionsAcknowledged,
		"params": map[string]any{"_meta": sub, "notifications": ack}}) {
		return
	}
	if len(ids) == 0 && len(resources) == 0 {
		// Nothing to tell of: the stream ends, as for an empty filter.
		send(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]any{"_meta": sub, "resultType": "complete"}})
		return
	}
	for {
		select {
		case notice := <-out:
			var params map[string]json.RawMessage
			if json.Unmarshal(notice.params, &params) != nil {
				continue
			}
			params["_meta"], _ = json.Marshal(sub)
			if !send(map[string]any{"jsonrpc": "2.0", "method": notice.method, "params": params}) {
				return
			}
		case <-gone:
			send(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]any{"_meta": sub, "resultType": "complete"}})
			return
		case <-ctx.Done():
			return
		}
	}
}

// pendingURIs are the resources updated since a listen's stream last
// passed them on, once each: an update says "read it again", so two that
// wait are one.
type pendingURIs struct {
	mu    sync.Mutex
	uris  []string
	ready chan struct{} // one signal at most
}

func (p *pendingURIs) add(uri string) {
	p.mu.Lock()
	if !slices.Contains(p.uris, uri) {
		p.uris = append(p.uris, uri)
	}
	p.mu.Unlock()
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// pass puts the updates on out as notifications/resources/updated until
// ctx ends.
func (p *pendingURIs) pass(ctx context.Context, out chan<- listenNotice) {
	for {
		select {
		case <-p.ready:
		case <-ctx.Done():
			return
		}
		p.mu.Lock()
		uris := p.uris
		p.uris = nil
		p.mu.Unlock()
		for _, uri := range uris {
			params, _ := json.Marshal(map[string]string{"uri": uri})
			select {
			case out <- listenNotice{string(mcp.MethodNotificationResourceUpdated), params}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// listenWithMCP has mcp-go serve a listen that asks for more than task
// ids and resources: body without them. ack is what capgate agreed to of
// those, and their notifications come on out.
func (m *MCP) listenWithMCP(w http.ResponseWriter, r *http.Request, body []byte, params map[string]json.RawMessage, ack map[string]any, out <-chan listenNotice, gone <-chan struct{}) {
	var top, n map[string]json.RawMessage
	json.Unmarshal(body, &top)
	json.Unmarshal(params["notifications"], &n)
	delete(n, "taskIds")
	delete(n, "resourceSubscriptions")
	rest := make(map[string]json.RawMessage, len(params))
	for k, v := range params {
		rest[k] = v
	}
	rest["notifications"], _ = json.Marshal(n)
	top["params"], _ = json.Marshal(rest)
	body, err := json.Marshal(top)
	if err != nil {
		writeRPCError(w, top["id"], mcp.INTERNAL_ERROR, "subscriptions/listen: "+err.Error(), nil)
		return
	}
	hold := &listenHold{ready: make(chan struct{})}
	aw := &ackWriter{ResponseWriter: w, agreed: ack, acked: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), listenHoldKey{}, hold))
	defer cancel()
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	served := make(chan struct{})
	go func() {
		defer close(served)
		// After the acknowledgement (written with capgate's part), into the
		// listen's own session: mcp-go writes them on its stream, tagged.
		for _, wait := range []chan struct{}{aw.acked, hold.ready} {
			select {
			case <-wait:
			case <-ctx.Done():
				return
			}
		}
		for {
			select {
			case notice := <-out:
				var p map[string]any
				if json.Unmarshal(notice.params, &p) != nil {
					continue
				}
				nt := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION,
					Notification: mcp.Notification{Method: notice.method, Params: mcp.NotificationParams{AdditionalFields: p}}}
				select {
				case hold.session.NotificationChannel() <- nt:
				case <-ctx.Done():
					return
				}
			case <-gone:
				cancel() // mcp-go ends the stream with the listen's result
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	m.stream.ServeHTTP(aw, r)
	cancel()
	<-served
}

type listenHoldKey struct{}

// listenHold is where heldListen leaves the session mcp-go serves a
// listen with.
type listenHold struct {
	once    sync.Once
	session mcpserver.ClientSession
	ready   chan struct{}
}

// heldListen is mcp-go's hook before a subscriptions/listen: for a listen
// capgate adds task notifications to (listenWithMCP), it hands over the
// listen's session.
func heldListen(ctx context.Context, _ any, _ *mcp.SubscriptionsListenRequest) {
	hold, ok := ctx.Value(listenHoldKey{}).(*listenHold)
	s := mcpserver.ClientSessionFromContext(ctx)
	if !ok || s == nil {
		return
	}
	hold.once.Do(func() {
		hold.session = s
		close(hold.ready)
	})
}

// ackWriter adds what capgate agreed to (task ids, resources) to the
// acknowledgement mcp-go writes first on a listen's stream (the one event
// of its first write), and then says it was written.
type ackWriter struct {
	http.ResponseWriter
	agreed map[string]any
	once   sync.Once
	acked  chan struct{}
}

func (a *ackWriter) Write(b []byte) (int, error) {
	first := false
	a.once.Do(func() { first = true })
	if !first {
		return a.ResponseWriter.Write(b)
	}
	data, ok := bytes.CutPrefix(b, ssePrefix)
	var msg, params, n map[string]json.RawMessage
	if !ok || json.Unmarshal(bytes.TrimSpace(data), &msg) != nil || string(msg["method"]) != `"`+mcp.MethodNotificationSubscriptionsAcknowledged+`"` ||
		json.Unmarshal(msg["params"], &params) != nil || json.Unmarshal(params["notifications"], &n) != nil {
		return a.ResponseWriter.Write(b) // not the acknowledgement: nothing of capgate's agreed
	}
	if n == nil {
		n = map[string]json.RawMessage{}
	}
	for k, v := range a.agreed {
		n[k], _ = json.Marshal(v)
	}
	params["notifications"], _ = json.Marshal(n)
	msg["params"], _ = json.Marshal(params)
	out, err := json.Marshal(msg)
	if err != nil {
		return a.ResponseWriter.Write(b)
	}
	if _, err := a.ResponseWriter.Write(sseMessage(out)); err != nil {
		return 0, err
	}
	close(a.acked)
	return len(b), nil
}

// Flush and Unwrap let mcp-go flush the stream through a.
func (a *ackWriter) Flush()                      { http.NewResponseController(a.ResponseWriter).Flush() }
func (a *ackWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }
