// Package router is the one pipeline every call passes, from MCP and the
// capability RPC alike: verify the caller's token, resolve the tool, run
// the gates (capability, acknowledge, chat policy, auth, rate limit),
// validate the input, honour idempotency keys, execute with a deadline,
// harden the output and audit. Every path fails closed: any doubt is a
// denial with a stable code.
package router

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router/inflight"
	"github.com/capgate/capgate/router/state"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// State is what the router keeps between calls. *store.Store implements it;
// the interfaces stay small so another backend (PostgreSQL) can too.
type State interface {
	Credentials
	Flows
	Idempotency
	Approvals
	Tasks
}

// Tasks keeps which caller owns which task (task.go), for every replica.
type Tasks interface {
	// CreateTask records a task made for sub, live for ttl, under a new id.
	CreateTask(ctx context.Context, sub, toolID, upstreamID, requestID string, ttl time.Duration) (*state.Task, error)
	// Task is the live task id, or state.ErrNotFound.
	Task(ctx context.Context, id string) (*state.Task, error)
}

type Credentials interface {
	PutCredential(ctx context.Context, sub, capabilityID, accountRef string, material []byte) error
	Credential(ctx context.Context, sub, capabilityID, accountRef string) ([]byte, error)
	Accounts(ctx context.Context, sub, capabilityID string) ([]string, error)
}

type Flows interface {
	BeginFlow(ctx context.Context, sub, capabilityID, accountHint string, state []byte) (*state.Flow, error)
	TakeFlow(ctx context.Context, id, sub string) (*state.Flow, error)
}

// Idempotency claims a key before the call runs (one row, taken
// atomically), renews the claim's lease while it runs, then completes or
// releases the claim.
type Idempotency interface {
	ClaimIdempotency(ctx context.Context, sub, toolID, key, inputHash string, lease, keep time.Duration) (claim string, rec *state.IdempotencyRecord, err error)
	RenewIdempotency(ctx context.Context, sub, toolID, key, claim string, lease time.Duration) error
	RetakeIdempotency(ctx context.Context, sub, toolID, key, inputHash string, lease time.Duration) (claim string, err error)
	CompleteIdempotency(ctx context.Context, sub, toolID, key, claim string, result []byte, ttl time.Duration) error
	ReleaseIdempotency(ctx context.Context, sub, toolID, key, claim string) error
}

// Approvals: ApprovalFor looks without using; UseApproval uses one
// atomically, right before the call runs.
type Approvals interface {
	RequestApproval(ctx context.Context, sub, toolID, inputHash string, input []byte, ttl time.Duration) (*state.Approval, error)
	ApprovalFor(ctx context.Context, sub, toolID, inputHash string) (*state.Approval, error)
	UseApproval(ctx context.Context, sub, toolID, inputHash string) (*state.Approval, error)
	// Approval reads one as it stands (a held call watches its decision).
	Approval(ctx context.Context, id string) (*state.Approval, error)
}

// Policy is the operator's word on who may do what.
type Policy struct {
	Grants      []string           // every verified caller
	Acknowledge []string           // tiers acknowledged for every verified caller
	Subjects    map[string]Subject // added per sub
	// Anonymous, when set, is the identity of callers without a token.
	Anonymous *Subject
	RateLimit RateLimit
	// SideEffects is [policy.side_effects]: a policy per side-effect tag,
	// enforced by the side_effects gate for every caller. A tag not listed
	// is allowed.
	SideEffects map[risk.SideEffect]risk.EffectPolicy
}

// Subject is a caller's own grants and acknowledgements.
type Subject struct {
	Sub         string // for Anonymous only
	Grants      []string
	Acknowledge []string
}

// RateLimit is a token bucket per caller and tool; zero PerMinute is off.
type RateLimit struct {
	PerMinute float64
	Burst     int
}

// Options configure a Router.
type Options struct {
	Registry *registry.Registry
	Verifier *token.Verifier
	Risk     *risk.Table
	Policy   Policy
	State    State
	Audit    audit.Sink
	// Secret is the master key of bridge providers' keys: each provider's
	// per-call context tokens are signed with a key derived from it for
	// its namespace (token.BridgeKey), never with Secret itself.
	Secret []byte
	Logger *slog.Logger
	Now    func() time.Time
	// Metrics and Tracer observe every call, whatever its front door;
	// nil is off.
	Metrics Metrics
	Tracer  Tracer
	// InFlight lists the calls running now (the console's live page); it
	// outlives a reload's new router. Nil tracks none.
	InFlight *inflight.Tracker

	CallTimeout time.Duration // default 2m
	ApprovalTTL time.Duration // default 10m
	// ApprovalWait holds a call that needs an operator's approval for up
	// to this long ([policy] approval_wait), looking every ApprovalPoll
	// (default 500ms) for the decision; 0 refuses it at once.
	ApprovalWait   time.Duration
	ApprovalPoll   time.Duration
	IdempotencyTTL time.Duration // default 24h
	// IdempotencyLease is how long a key's claim holds unless renewed; the
	// replica running the call renews it every third of that, so a claim
	// not renewed for this long belongs to a replica that died. Default 6s.
	IdempotencyLease time.Duration
	// IdempotencyWait bounds how long a retry waits for the call in
	// progress under its key before answering "retry after". Default 5s.
	IdempotencyWait time.Duration
	// Repeatable are tool-id patterns (fnmatch) of tools the operator says
	// are safe to run again with the same input: a retry of a key whose
	// first attempt died with its replica runs them again; any other tool
	// gets an "outcome unknown" answer instead.
	Repeatable []string

	// RateBuckets, when set, holds the rate limit's buckets for every
	// replica (a shared store); nil keeps them in memory.
	RateBuckets RateBuckets
}

// Router decides and runs calls. It is safe for concurrent use.
type Router struct {
	opts     Options
	base     *grantSet            // policy grants for every caller
	subjects map[string]*grantSet // base plus the subject's own
	anon     *grantSet
	chain    []gate // the gates every call passes, in order (chain.go)
	schemas  schemaCache
	limits   limiter
	caps     capsCache
	toolCaps toolCaps
	bridge   bridgeKeys
	admitter audit.Admitter // opts.Audit, if it admits calls
	health   audit.Health   // opts.Audit, if it can tell
}

// grantSet is a compiled policy: grants that survived the risk table, and
// the tiers acknowledged. A token's ack claim or a skill's acknowledge may
// acknowledge fewer tiers; the grants that stood on a tier no longer
// acknowledged fall with it (narrow).
type grantSet struct {
	set   *permissions.Set
	acks  []string
	free  []string      // active grants whose tier needs no acknowledgement
	gated []tieredGrant // grants whose tier must be acknowledged (acknowledged or not)

	mu       sync.Mutex
	narrowed map[uint64]*permissions.Set // by the mask of acks still held
}

type tieredGrant struct{ grant, tier string }

// narrow returns the grants that stand when only acks (a subset of the
// set's acks) are acknowledged. Without gated grants, or with all their
// tiers held, it is the set itself: no allocation on the common path.
func (g *grantSet) narrow(acks []string) *permissions.Set {
	var mask uint64
	for i, a := range g.acks {
		if i < 64 && slices.Contains(acks, a) {
			mask |= 1 << i
		}
	}
	lost := false
	for _, t := range g.gated {
		if !slices.Contains(acks, t.tier) && slices.Contains(g.acks, t.tier) {
			lost = true
			break
		}
	}
	if !lost {
		return g.set
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.narrowed[mask]; ok && len(g.acks) <= 64 {
		return s
	}
	grants := slices.Clone(g.free)
	for _, t := range g.gated {
		if slices.Contains(acks, t.tier) && slices.Contains(g.acks, t.tier) {
			grants = append(grants, t.grant)
		}
	}
	// The grants parsed once already; an error cannot happen, and would
	// grant nothing (fail closed).
	s, _ := permissions.NewSet(grants...)
	if s == nil {
		s = &permissions.Set{}
	}
	if g.narrowed == nil {
		g.narrowed = map[uint64]*permissions.Set{}
	}
	g.narrowed[mask] = s
	return s
}

// unacknowledged returns a grant of the set that matches required but
// stands on a tier acks lacks, for the denial's hint.
func (g *grantSet) unacknowledged(required string, acks []string) (tieredGrant, bool) {
	if g == nil {
		return tieredGrant{}, false
	}
	for _, t := range g.gated {
		if !slices.Contains(acks, t.tier) && permissions.Match(t.grant, required) {
			return t, true
		}
	}
	return tieredGrant{}, false
}

// New compiles the policy. A grant the risk table refuses (a blocked tier
// not acknowledged) is dropped with a warning: the router never runs on a
// policy wider than the table allows.
func New(opts Options) (*Router, error) {
	if opts.Registry == nil || opts.Risk == nil || opts.State == nil {
		return nil, errors.New("router: Registry, Risk and State are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Audit == nil {
		opts.Audit = discard{}
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.Tracer == nil {
		opts.Tracer = noTracer{}
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 2 * time.Minute
	}
	if opts.ApprovalPoll <= 0 {
		opts.ApprovalPoll = 500 * time.Millisecond
	}
	if opts.ApprovalTTL <= 0 {
		opts.ApprovalTTL = 10 * time.Minute
	}
	if opts.IdempotencyTTL <= 0 {
		opts.IdempotencyTTL = 24 * time.Hour
	}
	if opts.IdempotencyLease <= 0 {
		opts.IdempotencyLease = 6 * time.Second
	}
	if opts.IdempotencyWait <= 0 {
		opts.IdempotencyWait = 5 * time.Second
	}
	r := &Router{opts: opts, subjects: map[string]*grantSet{}, chain: newChain(),
		schemas: newSchemaCache(), caps: newCapsCache(), toolCaps: newToolCaps()}
	r.admitter, _ = opts.Audit.(audit.Admitter)
	r.health, _ = opts.Audit.(audit.Health)
	r.limits.init(opts.Policy.RateLimit, opts.Now, opts.RateBuckets, opts.Logger)
	var err error
	if r.base, err = r.compile("policy", opts.Policy.Grants, opts.Policy.Acknowledge); err != nil {
		return nil, err
	}
	for sub, s := range opts.Policy.Subjects {
		g, err := r.compile("policy.subjects."+sub,
			append(slices.Clone(opts.Policy.Grants), s.Grants...),
			append(slices.Clone(opts.Policy.Acknowledge), s.Acknowledge...))
		if err != nil {
			return nil, err
		}
		r.subjects[sub] = g
	}
	if a := opts.Policy.Anonymous; a != nil {
		if strings.TrimSpace(a.Sub) == "" {
			return nil, errors.New("router: the anonymous subject needs a sub")
		}
		g, err := r.compile("auth.anonymous", a.Grants, a.Acknowledge)
		if err != nil {
			return nil, err
		}
		r.anon = g
	}
	return r, nil
}

func (r *Router) compile(where string, grants, acks []string) (*grantSet, error) {
	ev, err := r.opts.Risk.Evaluate(grants, acks)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	for _, g := range ev.Refused() {
		r.opts.Logger.Warn("grant refused by the risk table", "where", where, "grant", g.Grant, "why", g.Refused)
	}
	set, err := ev.Set()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	gs := &grantSet{set: set, acks: dedupe(acks)}
	for _, g := range ev.Grants {
		switch {
		case g.Tier != "" && g.Policy != risk.Allow:
			gs.gated = append(gs.gated, tieredGrant{g.Grant, g.Tier})
		case g.Active:
			gs.free = append(gs.free, g.Grant)
		}
	}
	return gs, nil
}

func dedupe(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

// Caller is a verified identity with the grants and acknowledgements it
// holds. Only Authenticate and Anonymous make one.
type Caller struct {
	Sub       string
	Claims    *token.Claims // nil for the anonymous caller
	Anonymous bool
	grants    *permissions.Set
	policy    *grantSet // the policy layer, narrowed again by a scope's acknowledge
	scope     *Scope    // the skill the caller is narrowed to, if any
	layers    []string  // who holds each layer of grants, child first, for hints
	guarantee string    // the layers joined by "+", for the audit
	acks      []string
}

// ChatType is the verified chat type, lower-cased; "" when the token has none.
func (c *Caller) ChatType() string {
	if c.Claims == nil {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(c.Claims.ChatType))
}

// ChatID is the verified chat id.
func (c *Caller) ChatID() string {
	if c.Claims == nil {
		return ""
	}
	return c.Claims.ChatID
}

// Grants are the caller's effective grants (for reports; never widen them).
func (c *Caller) Grants() *permissions.Set { return c.grants }

// Acknowledged are the tiers the caller has acknowledged.
func (c *Caller) Acknowledged() []string { return slices.Clone(c.acks) }

// Authenticate verifies a raw token and returns the caller it names. A
// blank token is the anonymous caller when the operator allows one. The
// error is a *tool.Error with code token_invalid and the reason; it never
// holds the token.
func (r *Router) Authenticate(raw string) (*Caller, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" && r.anon != nil {
		return r.Anonymous(), nil
	}
	if r.opts.Verifier == nil {
		return nil, &tool.Error{Code: tool.CodeTokenInvalid, Message: "token invalid: key: no token key is configured", Gate: "token"}
	}
	claims, err := r.opts.Verifier.Verify(raw)
	if err != nil {
		// The operator learns why (expired, signature, ...); the token
		// itself is never logged, and the detail holds none of it.
		if te, ok := errors.AsType[*token.Error](err); ok {
			r.opts.Logger.Info("token refused", "reason", string(te.Reason), "detail", te.Detail)
		}
		return nil, &tool.Error{Code: tool.CodeTokenInvalid, Message: strings.TrimPrefix(err.Error(), "token_invalid: "),
			Gate: "token", Hint: "present a valid, unexpired token signed with the configured key", Err: err}
	}
	return r.caller(claims), nil
}

// Anonymous returns the anonymous caller, or nil when there is none.
func (r *Router) Anonymous() *Caller {
	if r.anon == nil {
		return nil
	}
	return &Caller{Sub: r.opts.Policy.Anonymous.Sub, Anonymous: true, grants: r.anon.set, policy: r.anon, acks: r.anon.acks,
		layers: anonymousLayers, guarantee: layerAnonymous}
}

// caller narrows the policy for claims.Sub by the token's ack and caps:
// the ack claim acknowledges fewer tiers, and the policy grants that stood
// on a tier it drops fall too (Rye: without an acknowledgement, elevated
// grants are denied); caps in such a tier are dropped likewise.
func (r *Router) caller(claims *token.Claims) *Caller {
	g, ok := r.subjects[claims.Sub]
	if !ok {
		g = r.base
	}
	c := &Caller{Sub: claims.Sub, Claims: claims, grants: g.set, policy: g, acks: g.acks, layers: policyLayers, guarantee: layerPolicy}
	if claims.Ack != nil {
		c.acks = slices.DeleteFunc(slices.Clone(g.acks), func(t string) bool { return !slices.Contains(claims.Ack, t) })
		c.grants = g.narrow(c.acks)
	}
	if claims.Caps != nil {
		c.grants = r.caps.intersect(r.opts.Risk, claims.Caps, c.acks, c.grants)
		c.layers, c.guarantee = capsLayers, layerCaps+"+"+layerPolicy
	}
	return c
}

// capsCache keeps the compiled intersection of a token's caps with a
// policy set: tokens are reused across many calls, and compiling grants
// per call would dominate the router's own cost.
type capsCache struct {
	m *lru.Cache[capsKey, *permissions.Set]
}

// capsKey is a policy and a token's caps and acks, each length-prefixed
// so that no two lists share a key.
type capsKey struct {
	policy *permissions.Set
	caps   string
}

const maxCachedCaps = 4096

func newCapsCache() capsCache {
	m, _ := lru.New[capsKey, *permissions.Set](maxCachedCaps)
	return capsCache{m: m}
}

func (c *capsCache) intersect(table *risk.Table, caps, acks []string, policy *permissions.Set) *permissions.Set {
	var buf [256]byte
	key := binary.AppendUvarint(buf[:0], uint64(len(caps)))
	for _, cp := range caps {
		key = binary.AppendUvarint(key, uint64(len(cp)))
		key = append(key, cp...)
	}
	for _, a := range acks {
		key = binary.AppendUvarint(key, uint64(len(a)))
		key = append(key, a...)
	}
	k := capsKey{policy, string(key)}
	if s, ok := c.m.Get(k); ok {
		return s
	}
	// A caps claim that does not parse grants nothing (Intersect of nil):
	// fail closed. Caps in a tier the token does not acknowledge are
	// dropped, as policy grants are.
	var child *permissions.Set
	if ev, err := table.Evaluate(caps, acks); err == nil {
		child, _ = ev.Set()
	}
	s := permissions.Intersect(child, policy)
	c.m.Add(k, s)
	return s
}

// Scope narrows a call further: a skill's declared grants and
// acknowledgements, intersected with the caller's. Make one with NewScope,
// which drops the declared grants the skill's acknowledge does not cover.
type Scope struct {
	Name        string // the skill's; its grant layer is "skill NAME"
	Grants      *permissions.Set
	Acknowledge []string
	// Secrets reach the extension and bridge subprocesses the skill's
	// calls start, and only those, as secrets_allowed ([skills.NAME] env).
	Secrets map[string]string
	gated   *grantSet // the declared grants, for hints
}

// NewScope evaluates a skill's declared grants against its acknowledge
// with the risk table, as the policy's are: a grant in a tier that needs
// acknowledgement and lacks it is dropped.
func (r *Router) NewScope(name string, grants, acknowledge []string) (*Scope, error) {
	g, err := r.compile(layerSkill+name, grants, acknowledge)
	if err != nil {
		return nil, err
	}
	return &Scope{Name: name, Grants: g.set, Acknowledge: acknowledge, gated: g}, nil
}

// within returns the caller narrowed to the scope: the scope's grants, and
// the caller's own grants again under the tiers both acknowledge.
func (r *Router) within(c *Caller, s *Scope) *Caller {
	if s == nil {
		return c
	}
	n := *c
	n.scope = s
	n.acks = slices.DeleteFunc(slices.Clone(c.acks), func(t string) bool { return !slices.Contains(s.Acknowledge, t) })
	grants := c.grants
	if len(n.acks) < len(c.acks) && c.policy != nil {
		grants = c.policy.narrow(n.acks)
		if c.Claims != nil && c.Claims.Caps != nil {
			grants = r.caps.intersect(r.opts.Risk, c.Claims.Caps, n.acks, grants)
		}
	}
	n.grants = permissions.Intersect(s.Grants, grants)
	n.layers = append([]string{layerSkill + s.Name}, c.layers...)
	n.guarantee = layerSkill + s.Name + "+" + c.guarantee
	return &n
}

// Names of grant layers, for hints.
const (
	layerPolicy    = "policy"
	layerCaps      = "token caps"
	layerAnonymous = "anonymous"
	layerSkill     = "skill "
)

// The layers of callers made outside a scope, shared: never append to a
// Caller's layers in place.
var (
	policyLayers    = []string{layerPolicy}
	capsLayers      = []string{layerCaps, layerPolicy}
	anonymousLayers = []string{layerAnonymous}
)

type discard struct{}

func (discard) Log(audit.Event) {}

// parseResult reads a result stored for idempotency.
func parseResult(b []byte) (*tool.Result, error) {
	var res tool.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
