package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// MCP is the catalog served as one MCP server: every tool of the registry,
// shown to each caller only when it may fetch it, each call through the
// router.
type MCP struct {
	router   *router.Router
	registry *registry.Registry
	srv      *mcpserver.MCPServer
	jobs     jobs
	relay    relay

	fastCalls atomic.Int64 // tools/call served by fastCall
	live      liveSessions // mcp-go's sessions, for the fast call
	// stream is the streamable-HTTP transport, one for every way in, so
	// that sessions and streams are shared.
	stream   *mcpserver.StreamableHTTPServer
	sessions *sessionIDs // the stream's Mcp-Session-Id, bound to subjects

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
// with the catalog (clients get tools/list_changed).
func NewMCP(rt *router.Router, reg *registry.Registry) *MCP {
	m := &MCP{router: rt, registry: reg}
	hooks := &mcpserver.Hooks{}
	hooks.AddAfterListResources(m.filterResources)
	hooks.AddAfterListResourceTemplates(m.filterTemplates)
	hooks.AddAfterSubscribe(m.subscribed)
	hooks.AddAfterUnsubscribe(m.unsubscribed)
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
	m.sessions = newSessionIDs()
	// The front door checks the Host of loopback requests for every path
	// (rejectRebinding): mcp-go need not do it again.
	m.stream = mcpserver.NewStreamableHTTPServer(m.srv, mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithSessionIdManagerResolver(m.sessions), mcpserver.WithDisableLocalhostProtection(true))
	m.sync(reg.Snapshot())
	reg.Watch(m.sync)
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
	snap := m.registry.Snapshot()
	out := tools[:0:0]
	for _, t := range tools {
		if t.Name == UseSkill {
			if st, ok := m.useSkillTool(ctx, c); ok {
				out = append(out, st)
			}
			continue
		}
		if d, ok := snap.ByExposedName(t.Name); ok && m.router.Visible(c, d) {
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
		Annotations:    annotations(d),
		Meta: &mcp.Meta{AdditionalFields: map[string]any{
			"capgate/tool_id":      d.ID,
			"capgate/risk":         d.Risk.Level.String(),
			"capgate/side_effects": effects,
		}},
	}
	if len(d.OutputSchema) > 0 {
		t.RawOutputSchema = d.OutputSchema
	}
	return t
}

// annotations are MCP's hints as capgate shows them: per hint, the more
// cautious of what the upstream said and what capgate's classification
// says, since clients auto-approve on them. A hint the upstream did not
// give reads as the MCP spec's default (readOnly false, destructive true,
// idempotent false, openWorld true) unless the tool's side effects were
// declared by the operator or by the source (an extension's side_effects):
// that is evidence of what the tool does. Inferred effects and an
// operator's level alone are not: the first come from the upstream's own
// words, the second says how much to trust a call, not what it changes.
func annotations(d *tool.Descriptor) mcp.ToolAnnotation {
	writes, destructive, open := d.Mutating, false, false
	for _, e := range d.Risk.Effects {
		writes = writes || e.Writes()
		switch e {
		case risk.FSDelete, risk.DatabaseDelete, risk.CloudResourceDelete, risk.Payments, risk.SystemExec, risk.CloudKeyWrite:
			destructive = true
		case risk.NetworkHTTP, risk.NetworkSocket, risk.NetworkDNS:
			open = true
		}
	}
	destructive = destructive || d.Risk.Level >= risk.High
	own := !writes && !destructive // capgate's read-only, and so idempotent
	declared := d.Risk.EffectsFrom == risk.FromOperator || d.Risk.EffectsFrom == risk.FromSource
	said := func(h *bool, spec, evidence bool) bool {
		switch {
		case h != nil:
			return *h
		case declared:
			return evidence
		}
		return spec
	}
	a := d.Annotations
	readOnly := said(a.ReadOnlyHint, false, own) && own
	// The spec's destructive default is for tools that write; a tool both
	// sides call read-only is not destructive unless one says so.
	destructive = said(a.DestructiveHint, !readOnly, destructive) || destructive
	readOnly = readOnly && !destructive
	idempotent := said(a.IdempotentHint, false, own) && own
	open = said(a.OpenWorldHint, true, open) || open
	return mcp.ToolAnnotation{Title: d.Title, ReadOnlyHint: &readOnly, DestructiveHint: &destructive,
		IdempotentHint: &idempotent, OpenWorldHint: &open}
}

// call runs a tools/call through the router, as a job so that the
// upstream can ask the client things mid-call. A denial is a tool result
// with isError, whose text an agent can explain to its user.
func (m *MCP) call(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := CallerFrom(ctx)
	if c == nil {
		return denial(tool.Errorf(tool.CodeTokenInvalid, "no verified caller")), nil
	}
	if req.Params.RequestState != "" {
		return m.jobs.resumeCall(ctx, c.Sub, req)
	}
	r := router.Request{Tool: req.Params.Name, Input: rawArguments(req), Protocol: protocolOf(ctx)}
	if res, ok := m.plan(ctx, c, req, r); ok {
		return res, nil
	}
	j := newJob(c.Sub)
	r.Progress = progressSender(j.current, req)
	r.Log = func(params json.RawMessage) { m.relayLog(j.current(), params) }
	j.run(func(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error) {
		r.Ask = ask
		res, inv, err := m.router.Invoke(ctx, c, r)
		var out *mcp.CallToolResult
		if err != nil {
			out = denial(err)
		} else if out, err = toMCPResult(res); err != nil {
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
		return denial(err), true
	}
	if !on {
		return nil, false
	}
	p, err := m.router.Plan(ctx, c, r)
	if err != nil {
		return denial(err), true
	}
	d, found := m.registry.Snapshot().Lookup(p.Tool)
	return mcpPlan(p, found && len(d.OutputSchema) > 0), true
}

// rawArguments are the call's arguments as the client sent them.
func rawArguments(req mcp.CallToolRequest) json.RawMessage {
	if len(req.Params.RawArguments) == 0 && req.Params.Arguments != nil {
		b, _ := json.Marshal(req.Params.Arguments)
		return b
	}
	return req.Params.RawArguments
}

// relayLog passes an upstream's log message to the client of the call,
// at the level that client asked for: on 2026-07-28 in the request, in a
// session with logging/setLevel (a session that never asked gets none).
func (m *MCP) relayLog(ctx context.Context, params json.RawMessage) {
	if ctx == nil {
		return
	}
	if s := m.live.of(ctx); s != nil && !s.leveled.Load() {
		return
	}
	var n mcp.LoggingMessageNotification
	n.Method = "notifications/message"
	if err := json.Unmarshal(params, &n.Params); err != nil {
		return
	}
	_ = m.srv.SendLogMessageToClient(ctx, n)
}

// denial turns a router error into an isError result: the code first,
// then the message, the capability string and what would allow it.
func denial(err error) *mcp.CallToolResult {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", tool.ErrorCode(err), tool.ErrorMessage(err))
	meta := map[string]any{"code": string(tool.ErrorCode(err))}
	var te *tool.Error
	if errors.As(err, &te) {
		if te.Required != "" {
			fmt.Fprintf(&b, "\nrequired: %s", te.Required)
			meta["required"] = te.Required
		}
		if te.Hint != "" {
			fmt.Fprintf(&b, "\nto allow it: %s", te.Hint)
			meta["hint"] = te.Hint
		}
		if te.Gate != "" {
			meta["gate"] = te.Gate
		}
	}
	res := mcp.NewToolResultError(b.String())
	res.Meta = &mcp.Meta{AdditionalFields: map[string]any{"capgate/error": meta}}
	return res
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
