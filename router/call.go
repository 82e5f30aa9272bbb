package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// Request is one call as a front door hands it to the router. Identity is
// never part of it: it comes from the Caller.
type Request struct {
	Tool           string // tool id (kind:source:name) or exposed name
	Input          json.RawMessage
	Account        string // which linked account to use, for tools that need auth
	IdempotencyKey string
	Scope          *Scope // a skill's narrower grants, when inside one
	Progress       func(progress, total float64, message string)
	// Log and Ask relay an upstream's log messages and its requests of the
	// calling client (sampling, elicitation) during the call; see tool.Call.
	Log       func(params json.RawMessage)
	Ask       func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
	Protocol  string // for the audit: "mcp/2025-11-25", "rpc", ...
	RequestID string
}

// Gate names, as they appear in denials and the audit log.
const (
	GateToken       = "token"
	GateResolve     = "resolve"
	GateCapability  = "capability"
	GateAcknowledge = "acknowledge"
	GateApproval    = "approval"
	GateChat        = "chat_policy"
	GateAuth        = "auth"
	GateRateLimit   = "rate_limit"
	GateInput       = "input"
	GateIdempotency = "idempotency"
	GateOutput      = "output"
)

// Call runs one tool call through every gate and audits it, whatever the
// outcome. The error, when not nil, is a *tool.Error whose message is safe
// to show the caller.
func (r *Router) Call(ctx context.Context, c *Caller, req Request) (*tool.Result, error) {
	start := time.Now()
	ev := audit.Event{Type: audit.TypeToolCall, ToolName: req.Tool, ProtocolVersion: req.Protocol, RequestID: req.RequestID}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	// First of all, the disk space for this call's records: a call the
	// audit log could not record does not run, nor even pass the gates.
	tk, err := r.admit()
	defer tk.Done()
	var res *tool.Result
	if err == nil {
		res, err = r.call(ctx, c, &req, &ev, &tk)
	}
	ev.Duration = time.Since(start)
	switch {
	case err == nil:
		ev.Decision = "allow"
		if res.IsError {
			ev.Detail = "the tool reported an error"
		}
	default:
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
	r.record(&tk, ev)
	return res, err
}

func isToolError(err error) bool {
	var te *tool.Error
	return errors.As(err, &te)
}

func (r *Router) call(ctx context.Context, c *Caller, req *Request, ev *audit.Event, tk *audit.Ticket) (*tool.Result, error) {
	if c == nil {
		return nil, &tool.Error{Code: tool.CodeTokenInvalid, Message: "token invalid: missing", Gate: GateToken}
	}
	// Whether the tool exists is the caller's question; a skill's scope
	// only narrows what it may do, so its refusal can name the skill.
	d, err := r.resolve(c, req.Tool)
	if err != nil {
		return nil, err
	}
	c = c.within(req.Scope)
	ev.Tool, ev.Runner, ev.ResolvedSource, ev.ToolName = d.ID, string(d.Kind), d.Source, d.ExposedName

	input, value, err := parseInput(req.Input)
	if err != nil {
		return nil, err
	}
	inputHash := hashInput(value)
	ev.InputSHA256 = inputHash

	// (a) capability string.
	if err := r.capabilityGate(c, d, req, ev, tk); err != nil {
		return nil, err
	}
	// (b) acknowledge, or for a blocked tier an operator's approval.
	approval, err := r.tierGate(ctx, c, d, inputHash)
	if err != nil {
		return nil, err
	}
	if approval != nil {
		ev.ApprovalID = approval.ID
		r.record(tk, audit.Event{Type: audit.TypeApproval, Sub: c.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType,
			Tool: d.ID, ToolName: d.ExposedName, Decision: "allow", Gate: GateApproval, ApprovalID: approval.ID,
			InputSHA256: inputHash, RequestID: req.RequestID, Detail: "approval used; approved by " + approval.ApprovedBy})
	}
	// (c) chat policy.
	if err := chatGate(c, d); err != nil {
		return nil, err
	}
	// (d) auth: a stored credential for (caller, capability, account).
	account, err := r.authGate(ctx, c, d, req.Account)
	if err != nil {
		return nil, err
	}
	ev.AccountRef = account
	// (e) rate limit.
	if !r.limits.allow(c.Sub, d.ID) {
		return nil, &tool.Error{Code: tool.CodeRateLimited, Gate: GateRateLimit,
			Message: fmt.Sprintf("rate limit reached for %s on %s", c.Sub, d.ID), Hint: "retry later"}
	}

	if err := r.schemas.validate(d, value); err != nil {
		return nil, err
	}

	idem := req.IdempotencyKey != "" && mutating(d)
	if idem {
		rec, err := r.opts.State.Idempotency(ctx, c.Sub, d.ID, req.IdempotencyKey)
		switch {
		case err == nil && rec.InputHash == inputHash:
			ev.Detail = "idempotent replay"
			return parseResult(rec.Result)
		case err == nil:
			return nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateIdempotency,
				Message: "idempotency key " + quoteKey(req.IdempotencyKey) + " was already used with another input",
				Hint:    "use a new key for a new input"}
		case !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
	}

	call := tool.Call{Input: input, Account: account, IdempotencyKey: req.IdempotencyKey, Progress: req.Progress,
		Log: req.Log, Ask: req.Ask}
	if d.Kind == tool.KindBridge {
		if call.ContextToken, err = r.bridgeToken(c); err != nil {
			return nil, err
		}
	}
	if err := r.auditGate(); err != nil {
		return nil, err
	}
	tk.Keep(1) // room for the tool_call record only, while the tool runs
	ctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	res, err := r.opts.Registry.Call(ctx, d.ID, call)
	if err != nil {
		if ctx.Err() != nil && !isToolError(err) {
			return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s did not answer in time", d.ID)
		}
		return nil, err
	}
	if res == nil {
		return nil, tool.Errorf(tool.CodeInvalidOutput, "%s returned no result", d.ID)
	}
	if key, found := credentialKey(res); found {
		return nil, &tool.Error{Code: tool.CodeInvalidOutput, Gate: GateOutput,
			Message: fmt.Sprintf("the output of %s was withheld: it holds a credential-like key (%s)", d.ID, key),
			Hint:    "the tool's source must not return credentials"}
	}
	if idem {
		b, err := json.Marshal(res)
		if err == nil {
			err = r.opts.State.PutIdempotency(ctx, c.Sub, d.ID, req.IdempotencyKey, inputHash, b, r.opts.IdempotencyTTL)
		}
		if err != nil && !errors.Is(err, store.ErrExists) {
			r.opts.Logger.Warn("idempotency record not stored", "tool", d.ID, "err", err)
		}
	}
	return res, nil
}

func quoteKey(k string) string {
	if len(k) > 64 {
		k = k[:64] + "…"
	}
	return fmt.Sprintf("%q", k)
}

// mutating reports tools whose repeated call would change something.
func mutating(d *tool.Descriptor) bool {
	return d.Mutating || slices.ContainsFunc(d.Risk.Effects, risk.SideEffect.Writes)
}

// resolve finds a tool by id or exposed name. A tool the caller may not
// fetch is answered exactly like one that does not exist.
func (r *Router) resolve(c *Caller, name string) (*tool.Descriptor, error) {
	snap := r.opts.Registry.Snapshot()
	d, ok := snap.ByExposedName(name)
	if !ok {
		d, ok = snap.Lookup(name)
	}
	if !ok || d == nil || !r.visible(c, d) {
		return nil, &tool.Error{Code: tool.CodeNotFound, Gate: GateResolve, Message: fmt.Sprintf("no tool named %q", name)}
	}
	return d, nil
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
	m sync.Map // tool id → *capStrings
	n atomic.Int64
}

type capStrings struct{ fetch, execute string }

const maxToolCaps = 1 << 14

func (t *toolCaps) get(id string) *capStrings {
	if v, ok := t.m.Load(id); ok {
		return v.(*capStrings)
	}
	cs := &capStrings{
		fetch:   permissions.Required(permissions.Fetch, permissions.Tool, id),
		execute: permissions.Required(permissions.Execute, permissions.Tool, id),
	}
	if v, loaded := t.m.LoadOrStore(id, cs); loaded {
		return v.(*capStrings)
	}
	if t.n.Add(1) > maxToolCaps {
		t.m.Clear()
		t.n.Store(0)
	}
	return cs
}

// List returns the tools the caller may see, in id order.
func (r *Router) List(c *Caller, scope *Scope, f registry.Filter) []*tool.Descriptor {
	if c == nil {
		return nil
	}
	c = c.within(scope)
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
	check := audit.Event{Type: audit.TypeCapabilityCheck, ToolName: d.ExposedName, Runner: string(d.Kind),
		ResolvedSource: d.Source, Capability: required, Allowed: allowed, Reason: reason,
		ProtocolVersion: req.Protocol, Sub: c.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType, Tool: d.ID,
		Gate: GateCapability, RequestID: req.RequestID}
	if allowed {
		check.GuaranteeSource, check.Decision = c.guarantee, "allow"
		r.record(tk, check)
		return nil
	}
	layer := "policy"
	if refused < len(c.layers) {
		layer = c.layers[refused]
	}
	check.GuaranteeSource, check.Decision = layer, "deny"
	r.record(tk, check)
	return &tool.Error{Code: tool.CodePermissionDenied, Gate: GateCapability, Required: required,
		Message: fmt.Sprintf("%s is not granted (refused by the %s grants)", required, layer),
		Hint:    grantHint(c, layer, required)}
}

func grantHint(c *Caller, layer, required string) string {
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
// and input, which this call uses up.
func (r *Router) tierGate(ctx context.Context, c *Caller, d *tool.Descriptor, inputHash string) (*store.Approval, error) {
	tier, err := r.opts.Risk.ToolTier(d.Risk.Level)
	if err != nil {
		return nil, &tool.Error{Code: tool.CodeAccessDenied, Gate: GateAcknowledge, Err: err,
			Message: fmt.Sprintf("%s has no risk tier (level %q): refused", d.ID, d.Risk.Level),
			Hint:    "an operator sets the tool's risk in capgate.toml"}
	}
	switch tier.Policy {
	case risk.Allow:
		return nil, nil
	case risk.AcknowledgeRequired:
		if slices.Contains(c.acks, tier.Name) {
			return nil, nil
		}
		return nil, &tool.Error{Code: tool.CodeAcknowledgeNeeded, Gate: GateAcknowledge, Required: tier.Name,
			Message: fmt.Sprintf("%s is risk %s, tier %s: the caller has not acknowledged %s", d.ID, d.Risk.Level, tier.Name, tier.Name),
			Hint:    fmt.Sprintf("acknowledge %q: the token's ack claim, [policy] acknowledge or [policy.subjects.%s] acknowledge", tier.Name, c.Sub)}
	case risk.Block:
		a, err := r.opts.State.UseApproval(ctx, c.Sub, d.ID, inputHash)
		if err == nil {
			return a, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		a, err = r.opts.State.RequestApproval(ctx, c.Sub, d.ID, inputHash, r.opts.ApprovalTTL)
		if err != nil {
			return nil, err
		}
		return nil, &tool.Error{Code: tool.CodeApprovalRequired, Gate: GateApproval, Required: tier.Name,
			Message: fmt.Sprintf("%s is risk %s, tier %s: an operator must approve this call (approval %s, valid until %s)",
				d.ID, d.Risk.Level, tier.Name, a.ID, a.ExpiresAt.UTC().Format(time.RFC3339)),
			Hint: fmt.Sprintf("an operator runs `capgate approve %s` on the host; then retry the same call with the same input", a.ID)}
	}
	return nil, &tool.Error{Code: tool.CodeAccessDenied, Gate: GateAcknowledge,
		Message: fmt.Sprintf("tier %s has an unknown policy %q: refused", tier.Name, tier.Policy)}
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
		if errors.Is(err, store.ErrNotFound) {
			need.Message = fmt.Sprintf("%s: no linked account %q for %s", d.ID, account, capID)
			return "", need
		}
		return account, err
	}
	accounts, err := r.opts.State.Accounts(ctx, c.Sub, capID)
	switch {
	case err != nil:
		return "", err
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

// bridgeToken signs the short-lived Ash context token a bridge provider
// verifies: the caller's verified claims, nothing the caller said.
func (r *Router) bridgeToken(c *Caller) (string, error) {
	if len(r.opts.Secret) == 0 {
		return "", nil
	}
	cl := token.Claims{Sub: c.Sub}
	if k := c.Claims; k != nil {
		cl.ChatID, cl.ChatType, cl.ChatTitle, cl.Provider, cl.SessionKey = k.ChatID, k.ChatType, k.ChatTitle, k.Provider, k.SessionKey
		cl.ThreadID, cl.SourceUsername, cl.SourceDisplayName, cl.MessageID, cl.Timezone = k.ThreadID, k.SourceUsername, k.SourceDisplayName, k.MessageID, k.Timezone
	}
	s, err := token.Mint(r.opts.Secret, cl, token.MintOptions{Ash: true, TTL: 5 * time.Minute, Now: r.opts.Now})
	if err != nil {
		return "", fmt.Errorf("minting the bridge context token: %w", err)
	}
	return s, nil
}
