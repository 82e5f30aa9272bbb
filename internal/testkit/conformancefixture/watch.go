package main

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Resource updates, which mcp-go v1.2.1 leaves to the server: on
// 2025-11-25 to the sessions that sent resources/subscribe, on 2026-07-28
// to the subscriptions/listen streams whose filter names the resource
// (mcp-go records the filter on the stream's session but delivers no
// resources/updated by itself). The tools update_resource,
// watched_resources and served_protocol are not the suite's; capgate's
// tests use them.

type watchers struct {
	mu       sync.Mutex
	sessions map[string]map[string]bool   // uri → session ids (2025-11-25)
	streams  map[server.ClientSession]any // listen stream session → its subscription id
}

var watching = &watchers{sessions: map[string]map[string]bool{}, streams: map[server.ClientSession]any{}}

// listenStreams is the HTTP context function that keeps each
// subscriptions/listen stream's session while its request lasts.
func listenStreams(ctx context.Context, r *http.Request) context.Context {
	if r.Header.Get("Mcp-Method") != string(mcp.MethodSubscriptionsListen) {
		return ctx
	}
	session := server.ClientSessionFromContext(ctx)
	if session == nil {
		return ctx
	}
	watching.mu.Lock()
	watching.streams[session] = nil
	watching.mu.Unlock()
	context.AfterFunc(ctx, func() {
		watching.mu.Lock()
		delete(watching.streams, session)
		watching.mu.Unlock()
	})
	return ctx
}

// hookSubscriptions records 2025-11-25 sessions' resources/subscribe.
// On 2026-07-28 the method is gone (subscriptions/listen replaces it):
// mcp-go v1.2.1 still answers it, but it subscribes nothing here.
func hookSubscriptions(h *server.Hooks) {
	h.AddAfterSubscribe(func(ctx context.Context, _ any, req *mcp.SubscribeRequest, _ *mcp.EmptyResult) {
		if s := server.ClientSessionFromContext(ctx); s != nil && !mcp.IsModernProtocol(server.RequestProtocolVersion(ctx)) {
			watching.mu.Lock()
			if watching.sessions[req.Params.URI] == nil {
				watching.sessions[req.Params.URI] = map[string]bool{}
			}
			watching.sessions[req.Params.URI][s.SessionID()] = true
			watching.mu.Unlock()
		}
	})
	h.AddAfterUnsubscribe(func(ctx context.Context, _ any, req *mcp.UnsubscribeRequest, _ *mcp.EmptyResult) {
		if s := server.ClientSessionFromContext(ctx); s != nil {
			watching.mu.Lock()
			delete(watching.sessions[req.Params.URI], s.SessionID())
			watching.mu.Unlock()
		}
	})
}

// filterOf is the resource subscriptions of a listen stream's session.
func filterOf(s server.ClientSession) []string {
	if f, ok := s.(server.SessionWithSubscriptionFilter); ok {
		if filter, active := f.SubscriptionFilter(); active {
			return filter.ResourceSubscriptions
		}
	}
	return nil
}

// watched is every URI subscribed now, by resources/subscribe in a
// session and in a listen stream's filter: each sorted, once each.
func (w *watchers) watched() (sessions, streams []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for uri, ids := range w.sessions {
		if len(ids) > 0 {
			sessions = append(sessions, uri)
		}
	}
	for s := range w.streams {
		streams = append(streams, filterOf(s)...)
	}
	slices.Sort(sessions)
	slices.Sort(streams)
	return sessions, slices.Compact(streams)
}

// updated tells everyone watching uri that it changed, and says how many.
func (w *watchers) updated(s *server.MCPServer, uri string) int {
	w.mu.Lock()
	var ids []string
	for id := range w.sessions[uri] {
		ids = append(ids, id)
	}
	var streams []server.ClientSession
	for st := range w.streams {
		if slices.Contains(filterOf(st), uri) {
			streams = append(streams, st)
		}
	}
	w.mu.Unlock()
	n := 0
	for _, id := range ids {
		if s.SendNotificationToSpecificClient(id, string(mcp.MethodNotificationResourceUpdated), map[string]any{"uri": uri}) == nil {
			n++
		}
	}
	for _, st := range streams {
		select {
		case st.NotificationChannel() <- mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
			Method: string(mcp.MethodNotificationResourceUpdated),
			Params: mcp.NotificationParams{AdditionalFields: map[string]any{"uri": uri}},
		}}:
			n++
		default:
		}
	}
	return n
}

func addWatchTools(s *server.MCPServer) {
	// served_protocol says at which revision it was called: what capgate
	// speaks to this upstream for the caller.
	s.AddTool(tool("served_protocol", "Says the protocol revision of the call"),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(server.RequestProtocolVersion(ctx)), nil
		})
	s.AddTool(tool("update_resource", "Tells whoever subscribed to a resource that it changed",
		mcp.WithString("uri", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := watching.updated(s, req.GetString("uri", ""))
			return mcp.NewToolResultText("told " + strconv.Itoa(n)), nil
		})
	s.AddTool(tool("watched_resources", "Lists the resources someone subscribed to now, by resources/subscribe and by subscriptions/listen"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sessions, streams := watching.watched()
			return mcp.NewToolResultStructuredOnly(map[string]any{"subscribed": sessions, "listened": streams}), nil
		})
}
