package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/toolsearch"
)

// MCP is the catalog served as one MCP server: every tool of the registry,
// shown to each caller only when it may fetch it, each call through the
// router.
type MCP struct {
	parts atomic.Pointer[parts] // the router and registry of now (Swap)
	srv   *mcpserver.MCPServer
	jobs  jobs
	relay relay

	fastCalls     atomic.Int64 // tools/call served by fastCall
	streamedCalls atomic.Int64 // tools/call served by streamCall
	live          liveSessions // mcp-go's sessions, for the fast call
	// stream is the streamable-HTTP transport, one for every way in, so
	// that sessions and streams are shared.
	stream   *mcpserver.StreamableHTTPServer
	sessions *sessionIDs    // the stream's Mcp-Session-Id, bound to subjects
	ends     sessionEnds    // sessions their clients ended (DELETE)
	internal *internalCalls // continuations forwarded between replicas
	streams  callStreams    // streamed calls' streams, for resumes
	asks     clientAsks     // streamed calls' requests awaiting the client

	metrics *telemetry.Metrics // nil: off
	tracer  *telemetry.Tracer  // nil: off

	search search // [discovery]: search_tools and call_tool

	mu     sync.Mutex
	listed []byte // the registered tool list as JSON, to skip no-op syncs
	skills skillSet
}

type callerKey struct{}

// WithCaller returns ctx carrying the verified caller.
func WithCaller(ctx context.Context, c *router.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller ctx carries, or nil.
func CallerFrom(ctx context.Context) *router.Caller {
	c, _ := ctx.Value(callerKey{}).(*router.Caller)
	return c
}

// NewMCP builds the MCP server over reg and keeps its tool list in step
// with the catalog (clients get tools/list_changed). Its session ids and
// forwarded continuations are keyed from secret (Options.Secret).
func NewMCP(rt *router.Router, reg *registry.Registry, secret []byte) *MCP {
	m := &MCP{}
	m.parts.Store(&parts{router: rt, registry: reg})
	hooks := &mcpserver.Hooks{}
	hooks.AddAfterListResources(m.filterResources)
	hooks.AddAfterListResourceTemplates(m.filterTemplates)
	hooks.AddAfterSubscribe(m.subscribed)
	hooks.AddAfterUnsubscribe(m.unsubscribed)
	hooks.AddOnUnregisterSession(func(_ context.Context, s mcpserver.ClientSession) { m.unsubscribeAll(s.SessionID()) })
	hooks.AddAfterDiscover(m.discovered)
	hooks.AddBeforeSubscriptionsListen(heldListen)
	// mcp-go answers a tools/call of a tool it does not list (unknown, or
	// one the caller may not see) itself: count it and fail its span as
	// what it is, not as a success.
	hooks.AddOnError(func(ctx context.Context, _ any, method mcp.MCPMethod, _ any, err error) {
		if method == mcp.MethodToolsCall && errors.Is(err, mcpserver.ErrToolNotFound) {
			telemetry.OpFrom(ctx).Fail(string(tool.CodeNotFound))
		}
	})
	m.live.hook(hooks)
	m.srv = mcpserver.NewMCPServer(serverInfo.Name, serverInfo.Version,
		mcpserver.WithToolCapabilities(true),
		mcpserver.WithResourceCapabilities(true, true),
		mcpserver.WithPromptCapabilities(true),
		mcpserver.WithCompletions(),
		mcpserver.WithPromptCompletionProvider(m),
		mcpserver.WithResourceCompletionProvider(m),
		mcpserver.WithHooks(hooks),
		mcpserver.WithLogging(),
		mcpserver.WithRecovery(),
		mcpserver.WithResourceRecovery(),
		mcpserver.WithToolFilter(m.filter),
		mcpserver.WithPromptFilter(m.filterPrompts),
		mcpserver.WithInstructions("capgate routes every tool call through its capability policy. A denied call returns a result whose text names the code, the capability string that was missing and what would allow it."),
	)
	m.sessions = newSessionIDs(secret)
	m.internal = newInternalCalls(secret)
	m.streams.key(secret)
	// The front door checks the Host of loopback requests for every path
	// (rejectRebinding): mcp-go need not do it again.
	m.stream = mcpserver.NewStreamableHTTPServer(m.srv, mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithSessionIdManagerResolver(m.sessions), mcpserver.WithDisableLocalhostProtection(true))
	m.search.indexes = &toolsearch.Indexes{}
	m.watch(reg)
	m.startRelay(reg)
	return m
}

// Server is the underlying mcp-go server.
func (m *MCP) Server() *mcpserver.MCPServer { return m.srv }

// sync registers the snapshot's tools, replacing the previous set, when
// the list differs from what clients were last told.
func (m *MCP) sync(snap *registry.Snapshot) {
	tools := make([]mcpserver.ServerTool, 0, len(snap.Tools))
	listed := make([]mcp.Tool, 0, len(snap.Tools))
	for _, d := range snap.Tools {
		t := mcpTool(d)
		tools = append(tools, mcpserver.ServerTool{Tool: t, Handler: m.call})
		listed = append(listed, t)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.skills.enabled)+len(m.skills.problems) > 0 {
		t := useSkillBase()
		tools = append(tools, mcpserver.ServerTool{Tool: t, Handler: m.useSkill})
		listed = append(listed, t)
	}
	if st := m.searchTools(); st != nil {
		tools = append(tools, st...)
		for _, t := range st {
			listed = append(listed, t.Tool)
		}
		m.search.indexes.Prepare(snap)
	}
	b, _ := json.Marshal(listed)
	if m.listed != nil && bytes.Equal(b, m.listed) {
		return
	}
	m.listed = b
	m.srv.SetTools(tools...)
}

// filter shows a caller only the tools it may fetch.
func (m *MCP) filter(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	c := CallerFrom(ctx)
	if c == nil {
		return nil
	}
	if out, ok := m.searchFilter(ctx, c, tools); ok {
		return out
	}
	p := m.parts.Load()
	snap := p.registry.Snapshot()
	out := tools[:0:0]
	for _, t := range tools {
		if t.Name == UseSkill {
			if st, ok := m.useSkillTool(ctx, c); ok {
				out = append(out, st)
			}
			continue
		}
		if d, ok := snap.ByExposedName(t.Name); ok && p.router.Visible(c, d) {
			out = append(out, t)
		}
	}
	return out
}

// mcpTool is how a descriptor is listed: its exposed name, its input
// schema byte for byte, annotations derived from its risk, and capgate's
// view of it under _meta.
func mcpTool(d *tool.Descriptor) mcp.Tool {
	schema := d.InputSchema
	if len(schema) == 0 {
		schema = json.RawMessage(`{"type":"object"}`)
	}
	effects := make([]string, len(d.Risk.Effects))
	for i, e := range d.Risk.Effects {
		effects[i] = string(e)
	}
	t := mcp.Tool{
		Name:           d.ExposedName,
		Title:          d.Title,
		Description:    d.Description,
		RawInputSchema: schema,
		Annotations:    mcpconv.Annotations(d),
		Meta: &mcp.Meta{AdditionalFields: map[string]any{
			"capgate/tool_id":      d.ID,
			"capgate/risk":         d.Risk.Level.String(),
			"capgate/side_effects": effects,
		}},
	}
	if d.Guarantees != nil {
		t.Meta.AdditionalFields["capgate/guarantees"] = d.Guarantees
	}
	if len(d.OutputSchema) > 0 {
		t.RawOutputSchema = d.OutputSchema
	}
	return t
}

// call runs a tools/call through the router, as a job so that the
// upstream can ask the client things mid-call. A denial is a tool result
// with isError, whose text an agent can explain to its user.
func (m *MCP) call(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return m.callVia(ctx, req, "")
}

// callVia is call, audited with via: how the caller named the tool
// ("call_tool" for tool search's, "" for directly).
func (m *MCP) callVia(ctx context.Context, req mcp.CallToolRequest, via string) (*mcp.CallToolResult, error) {
	c := CallerFrom(ctx)
	if c == nil {
		return mcpconv.Denial(tool.Errorf(tool.CodeTokenInvalid, "no verified caller")), nil
	}
	if req.Params.RequestState != "" {
		return m.resume(ctx, c, req)
	}
	r := router.Request{Tool: req.Params.Name, Input: mcpconv.RawArguments(req), Protocol: protocolOf(ctx), Via: via,
		Tasks: callDeclaresTasks(ctx)}
	if res, ok := m.plan(ctx, c, req, r); ok {
		return res, nil
	}
	// The call runs to its end on the router of now, whatever a reload
	// swaps in meanwhile.
	rt := m.rt()
	j := newJob(c.Sub)
	// Upstreams are told what this client can be asked, and no more.
	j.values = mcpconv.WithAskable(ctx)
	if len(req.Params.InputResponses) > 0 {
		// Answers that come without a state: the upstream may know them.
		if b, err := json.Marshal(req.Params.InputResponses); err == nil {
			j.values = tool.WithAnswers(j.values, b)
		}
	}
	r.Progress = mcpconv.ProgressSender(j.relay, req)
	r.Log = func(params json.RawMessage) {
		j.relay(func(ctx context.Context) error { return m.relayLog(ctx, params) })
	}
	reqCtx := ctx
	j.run(func(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error) {
		r.Ask = ask
		if m.observed() {
			// The job's context is its own; its spans belong to the request.
			ctx = telemetry.Carry(reqCtx, ctx)
		}
		res, inv, err := rt.Invoke(ctx, c, r)
		if m.observed() {
			telemetry.OpFrom(ctx).Fail(outcome(res != nil && res.IsError, err))
		}
		var out *mcp.CallToolResult
		if err == nil && res.Task != nil {
			return nil, &taskCreated{task: taskInvocation(res.Task, inv)} // the request that waits answers it (jobs.wait)
		}
		if isUpstreamError(err) {
			return nil, err // the request that waits passes it on (jobs.wait)
		} else if err != nil {
			out = mcpconv.Denial(err)
		} else if out, err = mcpconv.ToResult(res); err != nil {
			return nil, err
		}
		return withInvocation(out, inv), nil
	})
	return m.jobs.wait(ctx, j)
}

// plan answers a planning call (_meta["capgate/mode"]), which needs no
// job: nothing runs, so no upstream asks anything. ok is false for a call
// to run.
func (m *MCP) plan(ctx context.Context, c *router.Caller, req mcp.CallToolRequest, r router.Request) (*mcp.CallToolResult, bool) {
	var mode any
	var present bool
	if req.Params.Meta != nil {
		mode, present = req.Params.Meta.AdditionalFields[metaMode]
	}
	on, err := planning(mode, present, `_meta["`+metaMode+`"]`)
	if err != nil {
		return mcpconv.Denial(err), true
	}
	if !on {
		return nil, false
	}
	p, err := m.rt().Plan(ctx, c, r)
	if err != nil {
		return mcpconv.Denial(err), true
	}
	d, found := m.reg().Snapshot().Lookup(p.Tool)
	return mcpPlan(p, found && len(d.OutputSchema) > 0), true
}

// relayLog passes an upstream's log message to the client of the request
// ctx serves, at the level that client asked for: on 2026-07-28 in the
// request, in a session with logging/setLevel (a session that never asked
// gets none). It fails unless the message was queued for the client.
func (m *MCP) relayLog(ctx context.Context, params json.RawMessage) error {
	if s := m.live.of(ctx); s != nil && !s.leveled.Load() {
		return errNotSent
	}
	var n mcp.LoggingMessageNotification
	n.Method = "notifications/message"
	if err := json.Unmarshal(params, &n.Params); err != nil {
		return err
	}
	if err := m.srv.SendLogMessageToClient(ctx, n); err != nil {
		return err
	}
	if !logSent(ctx, n.Params.Level) {
		return errNotSent
	}
	return nil
}

// errNotSent: a notification filtered out, not queued for the client.
var errNotSent = errors.New("not sent: the client did not ask for it")

// logSent says whether mcp-go sends a log message at level for the
// request ctx serves rather than filter it out (as SendLogMessageToClient
// decides).
func logSent(ctx context.Context, level mcp.LoggingLevel) bool {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.LogLevel != "" && level.ShouldSendTo(info.LogLevel)
	}
	s, ok := mcpserver.ClientSessionFromContext(ctx).(mcpserver.SessionWithLogging)
	return ok && level.ShouldSendTo(s.GetLogLevel())
}

// withInvocation puts what happened in the result's _meta: the invocation
// id (the audit records' request_id), the duration and the tool's declared
// side effects. capgate's keys replace any an upstream wrote.
func withInvocation(res *mcp.CallToolResult, inv router.Invocation) *mcp.CallToolResult {
	if res.Meta == nil {
		res.Meta = &mcp.Meta{}
	}
	if res.Meta.AdditionalFields == nil {
		res.Meta.AdditionalFields = map[string]any{}
	}
	res.Meta.AdditionalFields["capgate/invocation_id"] = inv.ID
	res.Meta.AdditionalFields["capgate/duration_ms"] = inv.DurationMS()
	res.Meta.AdditionalFields["capgate/side_effects"] = inv.SideEffectNames()
	return res
}
