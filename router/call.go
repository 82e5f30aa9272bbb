package router

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router/inflight"
	"github.com/capgate/capgate/router/state"
	"github.com/capgate/capgate/tool"
)

// Request is one call as a front door hands it to the router. Identity is
// never part of it: it comes from the Caller.
type Request struct {
	Tool string // tool id (kind:source:name) or, unless ByID, exposed name
	// ByID takes Tool as a tool id only: the capability RPC names tools by
	// id, MCP by exposed name.
	ByID           bool
	Input          json.RawMessage
	Account        string // which linked account to use, for tools that need auth
	IdempotencyKey string
	Scope          *Scope // a skill's narrower grants, when inside one
	Progress       func(progress, total float64, message string)
	// Log and Ask relay an upstream's log messages and its requests of the
	// calling client (sampling, elicitation) during the call; see tool.Call.
	Log      func(params json.RawMessage)
	Ask      func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
	Protocol string // for the audit: "mcp/2025-11-25", "rpc", ...
	// Via is how the caller named the tool, for the audit: "call_tool"
	// when tool search's call_tool ran it, empty when called directly.
	Via string
	// RequestID names the call in the audit log; empty, the router makes a
	// new invocation id, which is the usual case.
	RequestID string
	// ClientInvocationID is the caller's own id for the call (AgentOS's
	// invocation_id): recorded beside RequestID, never in its place.
	ClientInvocationID string
	// Tasks: the caller declared the MCP tasks extension on this call, so
	// the tool's upstream may make it a task (task.go).
	Tasks bool
}

// Invocation is what happened in one call, for its result: the id its
// audit records carry (request_id), how long it took, and the side effects
// the tool declares (none when the call never reached a tool).
type Invocation struct {
	ID          string
	Duration    time.Duration
	SideEffects []risk.SideEffect
	// End is when the call ended, the clock read once for its duration,
	// record and log line, and its answer's Date.
	End time.Time
}

// NewInvocationID names one call (or plan) in the audit log and its
// answer: "cap_" and 96 random bits from the runtime's ChaCha8 generator,
// cheaper than crypto/rand on the per-call path and still unpredictable.
func NewInvocationID() string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], rand.Uint64())
	binary.BigEndian.PutUint32(b[8:], rand.Uint32())
	return string(hex.AppendEncode([]byte("cap_"), b[:]))
}

// Gate names, as they appear in denials and the audit log.
const (
	GateToken       = "token"
	GateResolve     = "resolve"
	GateCapability  = "capability"
	GateAcknowledge = "acknowledge"
	GateApproval    = "approval"
	GateChat        = "chat_policy"
	GateSideEffects = "side_effects"
	GateAuth        = "auth"
	GateRateLimit   = "rate_limit"
	GateInput       = "input"
	GateIdempotency = "idempotency"
	GateOutput      = harden.Gate
	// GateSandbox refuses a call whose tool's confinement cannot be
	// enforced; the source that would launch it names this gate.
	GateSandbox = "sandbox"
)

// Call runs one tool call through every gate and audits it, whatever the
// outcome. The error, when not nil, is a *tool.Error whose message is safe
// to show the caller. A panic anywhere in the call (a gate, a source, the
// output checks) ends as an internal_error that is audited like any other
// outcome; the process lives on.
func (r *Router) Call(ctx context.Context, c *Caller, req Request) (*tool.Result, error) {
	res, _, err := r.Invoke(ctx, c, req)
	return res, err
}

// Invoke is Call, and says what happened: the invocation id, the duration
// and the tool's declared side effects, for the result's metadata.
func (r *Router) Invoke(ctx context.Context, c *Caller, req Request) (*tool.Result, Invocation, error) {
	start := time.Now()
	r.opts.Metrics.CallStarted()
	// A reload closes this registry's sources only after the call is done.
	r.opts.Registry.Hold()
	defer r.opts.Registry.Release()
	if req.RequestID == "" {
		req.RequestID = NewInvocationID()
	}
	inv := Invocation{ID: req.RequestID}
	if r.opts.InFlight != nil {
		fc := inflight.Call{RequestID: req.RequestID, Tool: req.Tool, Protocol: req.Protocol, Started: start}
		if c != nil {
			fc.Sub = c.Sub
		}
		defer r.opts.InFlight.Done(r.opts.InFlight.Start(fc))
	}
	// The call's state holds its request, record and ticket: one
	// allocation, which the gates (called through the chain) share.
	st := &callState{c: c, request: req, start: start}
	st.req, st.ev, st.tk = &st.request, &st.event, &st.ticket
	ev := st.ev
	*ev = audit.Event{Type: audit.TypeToolCall, ToolName: req.Tool, Protocol: req.Protocol, Via: req.Via, RequestID: req.RequestID,
		ClientInvocationID: req.ClientInvocationID}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	// First of all, the disk space for this call's records: a call the
	// audit log could not record does not run, nor even pass the gates.
	var err error
	st.ticket, err = r.admit()
	defer st.ticket.Done()
	if err == nil {
		r.startRecord(st.tk, ev, start)
	}
	var res *tool.Result
	if err == nil {
		res, err = r.recoverCall(ctx, st, &inv)
	}
	// One reading of the clock for the duration, the record's time and
	// the log line's: each costs up to half a µs on a busy VM's clock.
	end := time.Now()
	ev.Duration, ev.Time = end.Sub(start), end
	inv.Duration, inv.End = ev.Duration, end
	switch {
	case err == nil:
		ev.Decision = "allow"
		if res.IsError {
			ev.Detail = "the tool reported an error"
		}
	default:
		res = nil
		ev.Decision, ev.Code = "deny", string(tool.ErrorCode(err))
		var te *tool.Error
		if errors.As(err, &te) && te.Gate != "" {
			ev.Gate = te.Gate
		}
		if ev.Code == string(tool.CodeInternal) || ev.Code == string(tool.CodeBackendUnavailable) {
			ev.Decision = "error"
		}
		if !isToolError(err) {
			r.opts.Logger.Error("tool call failed", "tool", ev.Tool, "sub", ev.Sub, "err", err)
			err = tool.Wrap(err, tool.CodeInternal, "internal error")
		}
	}
	r.recordPtr(st.tk, ev)
	r.observe(ctx, ev)
	r.opts.Metrics.CallDone()
	return res, inv, err
}

// observe counts a refused call by code and gate, and logs one line per
// call: who, which tool, the decision and its code, and how long. Never
// the input, the result or the token.
func (r *Router) observe(ctx context.Context, ev *audit.Event) {
	if ev.Code != "" {
		r.opts.Metrics.Denied(ev.Code, ev.Gate)
		if ev.Gate == GateSandbox {
			// kind:source, as kernelDenied counts it.
			if kind, source, _, err := tool.ParseID(ev.Tool); err == nil {
				r.opts.Metrics.SandboxDenied(string(kind) + ":" + source)
			}
		}
	}
	h := r.opts.Logger.Handler()
	if !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	name := ev.ToolName
	if name == "" {
		name = ev.Tool
	}
	// Straight to the handler: Logger.LogAttrs would walk the stack for
	// the caller's pc (runtime.Callers, a measurable part of the line's
	// cost), which no handler of capgate's prints.
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	rec := slog.NewRecord(at, slog.LevelInfo, "call", 0)
	rec.AddAttrs(slog.String("sub", ev.Sub), slog.String("tool", name),
		slog.String("decision", ev.Decision), slog.String("code", ev.Code), slog.String("gate", ev.Gate),
		slog.Float64("duration_ms", float64(ev.Duration.Microseconds())/1000), slog.String("request_id", ev.RequestID))
	_ = h.Handle(ctx, rec)
}

// boundedBySource says whether d's source ends its calls, with an error
// of its own, within the router's call timeout (tool.Bounded).
func (r *Router) boundedBySource(d *tool.Descriptor) bool {
	src, ok := r.opts.Registry.Source(d)
	if !ok {
		return false
	}
	b, ok := src.(tool.Bounded)
	return ok && b.CallTimeout() > 0 && b.CallTimeout() <= r.opts.CallTimeout
}

// errorType is err's stable code for a span, "" for none.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	return string(tool.ErrorCode(err))
}

// recoverCall is call with a panic turned into an internal error.
func (r *Router) recoverCall(ctx context.Context, st *callState, inv *Invocation) (res *tool.Result, err error) {
	defer r.recovered(st.ev, "tool call", &err)
	return r.call(ctx, st, inv)
}

// recovered, deferred, turns a panic into an internal error in *err. The
// log has the panic and its stack, never the input.
func (r *Router) recovered(ev *audit.Event, what string, err *error) {
	if p := recover(); p != nil {
		r.opts.Logger.Error(what+" panicked", "tool", ev.Tool, "sub", ev.Sub, "request_id", ev.RequestID,
			"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		ev.Detail = "panic"
		*err = &tool.Error{Code: tool.CodeInternal, Message: "internal error: the " + strings.TrimPrefix(what, "tool ") + " failed inside capgate"}
	}
}

func isToolError(err error) bool {
	var te *tool.Error
	return errors.As(err, &te)
}

// call runs the gate chain (chain.go), then the tool: execution,
// hardening of its output, and the idempotency record of its result.
func (r *Router) call(ctx context.Context, st *callState, inv *Invocation) (*tool.Result, error) {
	defer r.settle(ctx, st)
	err := r.runChain(ctx, st)
	if st.d != nil {
		inv.SideEffects = st.d.Risk.Effects
	}
	if err != nil {
		return nil, err
	}
	if st.replay != nil {
		return st.replay, nil
	}
	return r.execute(ctx, st)
}

// execute runs the tool the chain let through, hardens its output and
// keeps its result under the call's idempotency key.
func (r *Router) execute(ctx context.Context, st *callState) (*tool.Result, error) {
	c, d, req, ev, tk := st.c, st.d, st.req, st.ev, st.tk
	input, account := st.input, st.account
	var err error
	// The tool gets the canonical input: the bytes that were hashed.
	call := tool.Call{Input: input, Account: account, IdempotencyKey: req.IdempotencyKey, Progress: req.Progress,
		Log: req.Log, Ask: req.Ask, Tasks: req.Tasks}
	if !c.Anonymous {
		call.Sub = c.Sub
	}
	if req.Scope != nil {
		call.Secrets = req.Scope.Secrets
	}
	relayed(&call, d, r.opts.Logger)
	if d.Kind == tool.KindBridge {
		if call.ContextToken, err = r.bridgeToken(c, d.Source); err != nil {
			return nil, err
		}
	}
	st.ran = true
	var held *audit.Ticket
	if ev.Guarantees != "" {
		// And for the capability_checks of guarantees that held it back:
		// one refusing to start it, or one per guarantee the kernel held
		// it to (no_network, no_subprocess).
		tk.Keep(3)
		// The observer records on a copy of the ticket on the heap, so
		// that an unconfined call's ticket and record stay on the stack.
		held = new(audit.Ticket)
		*held = *tk
		call.Denied = r.kernelDenied(held, *ev, d)
	} else {
		tk.Keep(1) // room for the tool_call record only, while the tool runs
	}
	// The call timeout: the source's own when it is as short (the usual
	// case, an MCP server's 60 s under the router's 2 minutes), else a
	// context of the router's.
	bounded := r.boundedBySource(d)
	if !bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.CallTimeout)
		defer cancel()
	}
	upCtx, up := r.opts.Tracer.Upstream(ctx, d.Name, d.ID, string(d.Kind), d.Source)
	res, err := r.opts.Registry.Call(upCtx, d.ID, call)
	if held != nil {
		*tk = *held // the observer stopped with the process
	}
	up.End(errorType(err))
	if err != nil {
		if te, ok := errors.AsType[*tool.Error](err); !ok || te.Gate != GateSandbox {
			r.opts.Metrics.UpstreamError(string(d.Kind) + ":" + d.Source)
		}
		r.guaranteeBlocked(tk, ev, d, err)
		if ctx.Err() != nil && !isToolError(err) {
			return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s did not answer in time", d.ID)
		}
		return nil, err
	}
	if res == nil {
		return nil, tool.Errorf(tool.CodeInvalidOutput, "%s returned no result", d.ID)
	}
	if err := harden.Output(d.ID, res); err != nil {
		return nil, err
	}
	if res.Task != nil {
		if bounded { // keeping the task is bounded by the call timeout still
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, st.start.Add(r.opts.CallTimeout))
			defer cancel()
		}
		if err := r.keepTask(ctx, st, res); err != nil {
			return nil, err
		}
	}
	if st.claim != "" {
		st.stopLease()
		b, err := json.Marshal(res)
		if err == nil {
			err = r.opts.State.CompleteIdempotency(context.WithoutCancel(ctx), c.Sub, d.ID, req.IdempotencyKey, st.claim, b, r.opts.IdempotencyTTL)
		}
		if err != nil {
			// The claim stays, no longer renewed: releasing it would let a
			// retry run the call a second time. Retries are told that its
			// outcome is unknown.
			r.opts.Logger.Error("idempotency result not stored; retries with the key are told its outcome is unknown", "tool", d.ID, "err", err)
		}
		st.claim = ""
	}
	return res, nil
}

// rateLimited is the refusal of a caller whose bucket for d is empty.
func rateLimited(c *Caller, d *tool.Descriptor) *tool.Error {
	return &tool.Error{Code: tool.CodeRateLimited, Gate: GateRateLimit,
		Message: fmt.Sprintf("rate limit reached for %s on %s", c.Sub, d.ID), Hint: "retry later"}
}

// Waiting for a call in progress under the same idempotency key: polls
// from idemPollMin, doubling to idemPollMax.
const (
	idemPollMin = 10 * time.Millisecond
	idemPollMax = 250 * time.Millisecond
)

// claimKey claims the idempotency key for this call (a claim id), or
// returns the result of the call that made it. While that call runs, it
// waits for its result, at most IdempotencyWait; then it refuses with
// rate_limited and a RetryAfter. A claim whose replica died while its
// call ran is refused as of unknown outcome, unless the tool is
// repeatable: then this call takes the claim over and runs.
func (r *Router) claimKey(ctx context.Context, c *Caller, d *tool.Descriptor, key, inputHash string) (string, *tool.Result, error) {
	deadline := time.Now().Add(r.opts.IdempotencyWait)
	wait := idemPollMin
	for {
		claim, rec, err := r.opts.State.ClaimIdempotency(ctx, c.Sub, d.ID, key, inputHash, r.opts.IdempotencyLease, r.opts.IdempotencyTTL)
		switch {
		case err != nil:
			// Fail closed: without the claim the call could run twice.
			return "", nil, storeUnavailable(err, GateIdempotency, "the idempotency record")
		case claim != "":
			return claim, nil, nil
		case rec.InputHash != inputHash:
			return "", nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateIdempotency,
				Message: "idempotency key " + quoteKey(key) + " was already used with another input",
				Hint:    "use a new key for a new input"}
		case !rec.InProgress:
			res, err := parseResult(rec.Result)
			if err != nil {
				return "", nil, fmt.Errorf("reading the idempotency record of %s: %w", d.ID, err)
			}
			return "", res, nil
		case rec.Dead && !r.repeatable(d):
			return "", nil, outcomeUnknown(key, d, rec)
		case rec.Dead:
			claim, err := r.opts.State.RetakeIdempotency(ctx, c.Sub, d.ID, key, inputHash, r.opts.IdempotencyLease)
			if err != nil {
				return "", nil, storeUnavailable(err, GateIdempotency, "the idempotency record")
			}
			if claim != "" {
				r.opts.Logger.Info("idempotency key retaken: its first call's replica died, and the tool is repeatable", "tool", d.ID)
				return claim, nil, nil
			}
			continue // another retry took it first, or its holder came back: look again
		}
		if time.Now().Add(wait).After(deadline) {
			return "", nil, r.inProgress(key, nil)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", nil, r.inProgress(key, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, idemPollMax)
	}
}

// quoteKey quotes a key for a message, cut to 64 bytes.
func quoteKey(k string) string {
	if len(k) > 64 {
		k = k[:64] + "…"
	}
	return fmt.Sprintf("%q", k)
}

// resolve finds a tool by id or exposed name (byID: by id only). A tool
// the caller may not fetch is answered exactly like one that does not
// exist; only one it may see gets a hint naming its id.
func (r *Router) resolve(c *Caller, name string, byID bool) (*tool.Descriptor, error) {
	snap := r.opts.Registry.Snapshot()
	var d *tool.Descriptor
	ok := false
	if !byID {
		d, ok = snap.ByExposedName(name)
	}
	if !ok {
		d, ok = snap.Lookup(name)
	}
	if !ok || d == nil || !r.visible(c, d) {
		if e := r.downSource(c, snap, name); e != nil {
			return nil, e
		}
		notFound := &tool.Error{Code: tool.CodeNotFound, Gate: GateResolve, Message: fmt.Sprintf("no tool named %q", name)}
		if byID {
			if alias, ok := snap.ByExposedName(name); ok && alias != nil && r.visible(c, alias) {
				notFound.Message = fmt.Sprintf("no capability with id %q: that is an MCP exposed name", name)
				notFound.Hint = "use the capability id " + idHint(alias)
			}
		}
		return nil, notFound
	}
	return d, nil
}

// downSource answers a call of a tool whose source failed to list (a
// stdio server that would not start), by id or by exposed name, with why,
// as capability_backend_unavailable, when the caller may see that tool;
// nil otherwise (not found, as any unknown tool).
func (r *Router) downSource(c *Caller, snap *registry.Snapshot, name string) *tool.Error {
	id, err := snap.DownTool(name)
	if err == nil || !(c.grants.Allows(permissions.Required(permissions.Fetch, permissions.Tool, id)) ||
		c.grants.Allows(permissions.Required(permissions.Execute, permissions.Tool, id))) {
		return nil
	}
	kind, rest, _ := strings.Cut(id, ":")
	source, _, _ := strings.Cut(rest, ":")
	e := tool.Wrap(err, tool.CodeBackendUnavailable, "%s: its source %s:%s is down: %v", id, kind, source, err)
	e.Gate = GateResolve
	return e
}

// DownSource is the error a call of name (a tool id or exposed name)
// gets from the resolve gate because the tool's source is down, when c
// may see such a tool; nil otherwise. The MCP front door asks it of a
// tool it does not list, to answer as the router would.
func (r *Router) DownSource(c *Caller, name string) *tool.Error {
	if c == nil {
		return nil
	}
	return r.downSource(c, r.opts.Registry.Snapshot(), name)
}

// idHint is how the capability RPC names a tool: a bridge operation by
// its capability and operation, any other tool by its id.
func idHint(d *tool.Descriptor) string {
	if capID := CapabilityID(d); capID != d.ID {
		_, op, _ := strings.Cut(d.Name, ".")
		return capID + " with operation " + op
	}
	return d.ID
}

// visible: fetching a tool needs rye.fetch.tool.<id>; as in Rye, the right
// to execute it implies the right to see it.
func (r *Router) visible(c *Caller, d *tool.Descriptor) bool {
	caps := r.toolCaps.get(d.ID)
	return c.grants.Allows(caps.fetch) || c.grants.Allows(caps.execute)
}

// Visible reports whether the caller may see the tool listed.
func (r *Router) Visible(c *Caller, d *tool.Descriptor) bool { return c != nil && r.visible(c, d) }

// toolCaps caches the capability strings of tool ids: visibility (checked
// more than once per call) and the capability gate need them on every
// call, and building them allocates. They depend on the id alone, so no
// catalog change makes an entry wrong: a replaced descriptor finds its
// id's strings, a new id gets its own. The bound is only for catalogs
// whose ids churn; it is approximate under concurrent misses.
type toolCaps struct {
	m *lru.Cache[string, *capStrings]
}

type capStrings struct{ fetch, execute string }

const maxToolCaps = 1 << 14

func newToolCaps() toolCaps {
	m, _ := lru.New[string, *capStrings](maxToolCaps)
	return toolCaps{m: m}
}

func (t *toolCaps) get(id string) *capStrings {
	if cs, ok := t.m.Get(id); ok {
		return cs
	}
	cs := &capStrings{
		fetch:   permissions.Required(permissions.Fetch, permissions.Tool, id),
		execute: permissions.Required(permissions.Execute, permissions.Tool, id),
	}
	t.m.Add(id, cs)
	return cs
}

// List returns the tools the caller may see, in id order.
func (r *Router) List(c *Caller, scope *Scope, f registry.Filter) []*tool.Descriptor {
	if c == nil {
		return nil
	}
	c = r.within(c, scope)
	all := r.opts.Registry.Snapshot().List(f)
	out := make([]*tool.Descriptor, 0, len(all))
	for _, d := range all {
		if r.visible(c, d) {
			out = append(out, d)
		}
	}
	return out
}

func (r *Router) capabilityGate(c *Caller, d *tool.Descriptor, req *Request, ev *audit.Event, tk *audit.Ticket) error {
	required := r.toolCaps.get(d.ID).execute
	allowed, refused, reason := c.grants.Explain(required)
	check := audit.Event{Type: audit.TypeGrantCheck, ToolName: d.ExposedName, Required: required, Explanation: reason,
		Protocol: req.Protocol, Via: req.Via, Sub: c.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType,
		Gate: GateCapability, RequestID: req.RequestID}
	resolved(&check, d)
	if allowed {
		check.Layer, check.Decision = c.guarantee, "allow"
		r.recordPtr(tk, &check)
		return nil
	}
	layer := "policy"
	if refused < len(c.layers) {
		layer = c.layers[refused]
	}
	check.Layer, check.Decision = layer, "deny"
	r.recordPtr(tk, &check)
	return &tool.Error{Code: tool.CodePermissionDenied, Gate: GateCapability, Required: required,
		Message: fmt.Sprintf("%s is not granted (refused by the %s grants)", required, layer),
		Hint:    r.grantHint(c, layer, required)}
}

func (r *Router) grantHint(c *Caller, layer, required string) string {
	if t, ok := r.unacknowledged(c, layer, required); ok {
		return fmt.Sprintf("grant %s would match, but its tier %s is not acknowledged: acknowledge %q to allow it (%s)",
			t.grant, t.tier, t.tier, ackWhere(c, layer))
	}
	switch {
	case layer == layerCaps:
		return "use a token whose caps include a pattern matching " + required
	case layer == layerAnonymous:
		return "send a token, or an operator adds a grant matching " + required + " to [auth.anonymous] grants"
	case strings.HasPrefix(layer, layerSkill):
		return "the " + layer + " must declare it (allowed_tools, capabilities or permissions)"
	default:
		return fmt.Sprintf("an operator adds a grant matching %s to [policy] grants or [policy.subjects.%s] grants", required, c.Sub)
	}
}

// tierGate enforces the tool's tier: acknowledge_required needs the tier
// acknowledged; block needs an operator's approval bound to caller, tool
// and input. It only looks: true means the call must use its approval
// (useApproval) once every other gate has passed. Without one it requests
// an approval, showing the operator the canonical input, and refuses;
// when request is false (planning), it only refuses.
func (r *Router) tierGate(ctx context.Context, c *Caller, d *tool.Descriptor, input []byte, inputHash string, request bool) (bool, error) {
	tier, err := r.opts.Risk.ToolTier(d.Risk.Level)
	if err != nil {
		return false, &tool.Error{Code: tool.CodeAccessDenied, Gate: GateAcknowledge, Err: err,
			Message: fmt.Sprintf("%s has no risk tier (level %q): refused", d.ID, d.Risk.Level),
			Hint:    "an operator sets the tool's risk in capgate.toml"}
	}
	switch tier.Policy {
	case risk.Allow:
		return false, nil
	case risk.AcknowledgeRequired:
		if slices.Contains(c.acks, tier.Name) {
			return false, nil
		}
		return false, &tool.Error{Code: tool.CodeAcknowledgeNeeded, Gate: GateAcknowledge, Required: tier.Name,
			Message: fmt.Sprintf("%s is risk %s, tier %s: the caller has not acknowledged %s", d.ID, d.Risk.Level, tier.Name, tier.Name),
			Hint:    fmt.Sprintf("acknowledge %q: the token's ack claim, [policy] acknowledge or [policy.subjects.%s] acknowledge", tier.Name, c.Sub)}
	case risk.Block:
		_, err := r.opts.State.ApprovalFor(ctx, c.Sub, d.ID, inputHash)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, state.ErrNotFound) {
			return false, storeUnavailable(err, GateApproval, "the approval")
		}
		if !request {
			return false, approvalPlanned(d, tier)
		}
		if r.opts.ApprovalWait > 0 {
			// Held: the approval gate, after every other gate, asks for
			// the approval and waits for the decision.
			return true, nil
		}
		return false, r.approvalRequired(ctx, c, d, input, inputHash)
	}
	return false, &tool.Error{Code: tool.CodeAccessDenied, Gate: GateAcknowledge,
		Message: fmt.Sprintf("tier %s has an unknown policy %q: refused", tier.Name, tier.Policy)}
}

// useApproval uses the call's approval: one statement marks it used, so
// of two calls on one approval only one gets it; the other is told to get
// a new one.
func (r *Router) useApproval(ctx context.Context, c *Caller, d *tool.Descriptor, input []byte, inputHash string,
	progress func(p, total float64, msg string)) (*state.Approval, error) {
	a, err := r.opts.State.UseApproval(ctx, c.Sub, d.ID, inputHash)
	if errors.Is(err, state.ErrNotFound) {
		if r.opts.ApprovalWait > 0 {
			return r.awaitApproval(ctx, c, d, input, inputHash, progress)
		}
		return nil, r.approvalRequired(ctx, c, d, input, inputHash)
	}
	if err != nil {
		return nil, storeUnavailable(err, GateApproval, "the approval")
	}
	return a, nil
}

// awaitApproval holds the call until an operator decides ([policy]
// approval_wait): it requests the approval, tells the caller it waits
// (progress), and uses the approval once approved. A denial fails the call
// with approval_denied; so does the wait running out, with
// approval_required, and the caller may repeat the call later.
func (r *Router) awaitApproval(ctx context.Context, c *Caller, d *tool.Descriptor, input []byte, inputHash string,
	progress func(p, total float64, msg string)) (*state.Approval, error) {
	tier, err := r.opts.Risk.ToolTier(d.Risk.Level)
	if err != nil {
		return nil, err
	}
	a, err := r.opts.State.RequestApproval(ctx, c.Sub, d.ID, inputHash, input, r.opts.ApprovalTTL)
	if err != nil {
		return nil, storeUnavailable(err, GateApproval, "the approval")
	}
	start := r.opts.Now()
	wait := min(r.opts.ApprovalWait, a.ExpiresAt.Sub(start))
	tick := time.NewTicker(r.opts.ApprovalPoll)
	defer tick.Stop()
	said := time.Time{}
	for {
		switch {
		case a.Denied():
			return nil, approvalDenied(d, tier, a)
		case a.Approved():
			used, err := r.opts.State.UseApproval(ctx, c.Sub, d.ID, inputHash)
			if err == nil {
				return used, nil
			}
			if !errors.Is(err, state.ErrNotFound) {
				return nil, storeUnavailable(err, GateApproval, "the approval")
			}
			// Another call with the same input took it: ask anew.
			return nil, r.approvalRequired(ctx, c, d, input, inputHash)
		}
		now := r.opts.Now()
		waited := now.Sub(start)
		if waited >= wait {
			return nil, &tool.Error{Code: tool.CodeApprovalRequired, Gate: GateApproval, Required: tier.Name,
				Message: fmt.Sprintf("%s is risk %s, tier %s: waited %s for an operator to approve this call (approval %s); still pending",
					d.ID, d.Risk.Level, tier.Name, waited.Round(time.Second), a.ID),
				Hint: fmt.Sprintf("an operator approves %s in the console or with `capgate approve %s`; then repeat the same call", a.ID, a.ID)}
		}
		if progress != nil && now.Sub(said) >= 5*time.Second {
			progress(waited.Seconds(), wait.Seconds(), "waiting for approval "+a.ID)
			said = now
		}
		select {
		case <-ctx.Done():
			return nil, &tool.Error{Code: tool.CodeApprovalRequired, Gate: GateApproval, Required: tier.Name, Err: ctx.Err(),
				Message: fmt.Sprintf("the call ended while waiting for approval %s", a.ID)}
		case <-tick.C:
		}
		if a, err = r.opts.State.Approval(ctx, a.ID); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				return nil, r.approvalRequired(ctx, c, d, input, inputHash)
			}
			return nil, storeUnavailable(err, GateApproval, "the approval")
		}
	}
}

// approvalRequired requests an operator's approval of the call (or finds
// the pending one) and returns the refusal that names it.
func (r *Router) approvalRequired(ctx context.Context, c *Caller, d *tool.Descriptor, input []byte, inputHash string) error {
	tier, err := r.opts.Risk.ToolTier(d.Risk.Level)
	if err != nil {
		return err
	}
	a, err := r.opts.State.RequestApproval(ctx, c.Sub, d.ID, inputHash, input, r.opts.ApprovalTTL)
	if err != nil {
		return storeUnavailable(err, GateApproval, "the approval")
	}
	if a.Denied() {
		return approvalDenied(d, tier, a)
	}
	return &tool.Error{Code: tool.CodeApprovalRequired, Gate: GateApproval, Required: tier.Name,
		Message: fmt.Sprintf("%s is risk %s, tier %s: an operator must approve this call (approval %s, valid until %s)",
			d.ID, d.Risk.Level, tier.Name, a.ID, a.ExpiresAt.UTC().Format(time.RFC3339)),
		Hint: fmt.Sprintf("an operator runs `capgate approve %s` on the host; then retry the same call with the same input", a.ID)}
}

// approvalDenied is the refusal of a call an operator denied: it stands
// for the same call until the denial expires, so that a caller retrying
// is told the decision rather than queued again.
func approvalDenied(d *tool.Descriptor, tier risk.Tier, a *state.Approval) error {
	msg := fmt.Sprintf("%s is risk %s, tier %s: an operator denied this call (approval %s)", d.ID, d.Risk.Level, tier.Name, a.ID)
	if a.Note != "" {
		msg += ": " + strconv.Quote(a.Note)
	}
	return &tool.Error{Code: tool.CodeApprovalDenied, Gate: GateApproval, Required: tier.Name, Message: msg,
		Hint: fmt.Sprintf("the same call stays denied until %s; ask the operator, or change the call", a.ExpiresAt.UTC().Format(time.RFC3339))}
}

// chatGate keeps sensitive tools to their chat types (private by default).
func chatGate(c *Caller, d *tool.Descriptor) error {
	allowed := d.AllowedChatTypes
	if d.Sensitive && len(allowed) == 0 {
		allowed = []string{"private"}
	}
	if len(allowed) == 0 {
		return nil
	}
	chat := c.ChatType()
	for _, a := range allowed {
		if chat != "" && strings.EqualFold(strings.TrimSpace(a), chat) {
			return nil
		}
	}
	in := "a chat of unknown type"
	if chat != "" {
		in = "a " + chat + " chat"
	}
	return &tool.Error{Code: tool.CodeAccessDenied, Gate: GateChat,
		Message: fmt.Sprintf("%s is only allowed in %s chats, not in %s", d.ID, strings.Join(allowed, " or "), in),
		Hint:    "call it from a " + strings.Join(allowed, " or ") + " chat"}
}

// authGate finds the stored credential a tool that requires auth runs
// with, and returns its account ref.
func (r *Router) authGate(ctx context.Context, c *Caller, d *tool.Descriptor, account string) (string, error) {
	if !d.RequiresAuth {
		return account, nil
	}
	capID := CapabilityID(d)
	need := &tool.Error{Code: tool.CodeAuthRequired, Gate: GateAuth, Required: capID,
		Message: fmt.Sprintf("%s needs a linked account for %s", d.ID, capID),
		Hint:    fmt.Sprintf("run capability.auth.begin for %s (capgate capability auth begin --capability %s), then auth complete", capID, capID)}
	if account != "" {
		_, err := r.opts.State.Credential(ctx, c.Sub, capID, account)
		if errors.Is(err, state.ErrNotFound) {
			need.Message = fmt.Sprintf("%s: no linked account %q for %s", d.ID, account, capID)
			return "", need
		}
		if err != nil {
			return "", storeUnavailable(err, GateAuth, "the linked account")
		}
		return account, nil
	}
	accounts, err := r.opts.State.Accounts(ctx, c.Sub, capID)
	switch {
	case err != nil:
		return "", storeUnavailable(err, GateAuth, "the linked accounts")
	case len(accounts) == 0:
		return "", need
	case len(accounts) == 1:
		return accounts[0], nil
	case slices.Contains(accounts, "default"):
		return "default", nil
	}
	return "", &tool.Error{Code: tool.CodeInvalidInput, Gate: GateAuth,
		Message: fmt.Sprintf("several accounts are linked for %s (%s): say which", capID, strings.Join(accounts, ", ")),
		Hint:    "pass the account"}
}

// CapabilityID is the capability a tool belongs to: for a bridge operation
// the namespaced capability (gog.email), for any other tool its id.
func CapabilityID(d *tool.Descriptor) string {
	if d.Kind == tool.KindBridge {
		if capName, _, ok := strings.Cut(d.Name, "."); ok {
			return d.Source + "." + capName
		}
	}
	return d.ID
}

// unacknowledged finds the grant of the refusing layer that would match
// required but stands on a tier the caller has not acknowledged, so that
// the hint names the acknowledgement rather than a new grant.
func (r *Router) unacknowledged(c *Caller, layer, required string) (tieredGrant, bool) {
	switch {
	case layer == layerCaps && c.Claims != nil:
		for _, cp := range c.Claims.Caps {
			cl := r.opts.Risk.Classify(cp)
			if cl.Classified && cl.Tier.Policy != risk.Allow && !slices.Contains(c.acks, cl.Tier.Name) && permissions.Match(cp, required) {
				return tieredGrant{cp, cl.Tier.Name}, true
			}
		}
	case strings.HasPrefix(layer, layerSkill) && c.scope != nil:
		return c.scope.gated.unacknowledged(required, c.scope.Acknowledge)
	case layer == layerPolicy || layer == layerAnonymous:
		return c.policy.unacknowledged(required, c.acks)
	}
	return tieredGrant{}, false
}

// ackWhere says where the layer's acknowledgement is set.
func ackWhere(c *Caller, layer string) string {
	switch {
	case strings.HasPrefix(layer, layerSkill):
		return "the " + layer + " must declare it: acknowledge in its frontmatter"
	case layer == layerAnonymous:
		return "[auth.anonymous] acknowledge"
	case c.Claims != nil && c.Claims.Ack != nil:
		return "the token's ack claim, and [policy] acknowledge or [policy.subjects." + c.Sub + "] acknowledge"
	default:
		return "[policy] acknowledge or [policy.subjects." + c.Sub + "] acknowledge"
	}
}
