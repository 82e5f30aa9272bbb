package router

import (
	"context"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// A call passes the gates of the chain in order; the first refusal ends
// it. Each gate is one small function over the call's state (gates.go),
// with its own tests; the chain times each with a span, once, here.
// Planning runs the same chain without side effects: a gate that takes or
// uses something has a plan function that only looks, or none (skipped).
//
// Adding a gate is one function in gates.go and one line in newChain.

// gate is one link of the chain.
type gate struct {
	name string // its span's name, "gate <name>"
	run  func(r *Router, ctx context.Context, st *callState) error
	// plan is what a planning call runs instead; nil skips the gate.
	plan func(r *Router, ctx context.Context, st *callState) error
}

// callState is what the gates learn about a call and hand on: the caller
// narrowed to the request's scope, the tool (set once resolved, even when
// a later gate refuses), its canonical input and hash, the account, and
// what the gates with side effects took (to give back on a later refusal).
type callState struct {
	c        *Caller
	req      *Request
	ev       *audit.Event
	tk       *audit.Ticket
	planning bool
	start    time.Time // when Invoke began
	// What req, ev and tk point to, kept here so that a call's state is
	// one allocation.
	request Request
	event   audit.Event
	ticket  audit.Ticket

	d            *tool.Descriptor
	input        []byte // canonical: what the tool gets, what approvals and keys bind to
	value        any    // the input decoded, for the schema
	inputHash    string
	account      string
	needApproval bool // a blocked tier: the call uses its approval last

	tok     taken  // the rate limit's token, given back unless the call ran
	limited string // planning: "ok" or "limited" once the rate limit looked
	claim   string // the idempotency claim, released unless its result was kept
	// stopLease stops renewing the claim's lease (idempotent); nil when
	// no claim was made.
	stopLease func()
	replay    *tool.Result // the result an idempotency key already has
	ran       bool         // the call was served (run or replayed): keep the token
}

// newChain is the order of the gates, the same for every call:
//
//  1. Decisions that change nothing, cheapest first: resolve, the input
//     read (its canonical bytes are what the tool gets and what approvals
//     and idempotency keys bind to), capability, tier (acknowledge; for a
//     blocked tier, that an approval exists, not yet using it), side
//     effects ([policy.side_effects]), chat policy, auth, schema, and the audit log's health.
//  2. The rate limit takes a token, given back when a later step refuses.
//  3. The idempotency key is claimed (or its result replayed, or the call
//     waits for the claimant's result).
//  4. The approval is used, atomically: last, so that no refusal above
//     wastes it and two calls cannot both run on it.
//
// Then the call runs (execute), its output is hardened and it is recorded.
func newChain() []gate {
	return []gate{
		{name: GateResolve, run: resolveGate, plan: resolveGate},
		{name: GateInput, run: inputGate, plan: inputGate},
		{name: GateCapability, run: capabilityGate, plan: capabilityGate},
		{name: GateAcknowledge, run: tierGate, plan: tierGate},
		{name: GateSideEffects, run: sideEffectsGate, plan: sideEffectsGate},
		{name: GateChat, run: chatPolicyGate, plan: chatPolicyGate},
		{name: GateAuth, run: authGate, plan: authGate},
		{name: gateSchema, run: schemaGate, plan: schemaGate},
		{name: GateAudit, run: auditHealthGate, plan: auditHealthGate},
		{name: GateRateLimit, run: rateLimitGate, plan: rateLimitPlan},
		{name: GateIdempotency, run: idempotencyGate},
		{name: GateApproval, run: approvalGate},
	}
}

// gateSchema names the schema gate's span; its refusals are GateInput's.
const gateSchema = "schema"

// runChain runs the gates in order for st, each in its span, and stops at
// the first refusal or at a replayed result.
func (r *Router) runChain(ctx context.Context, st *callState) error {
	if st.c == nil {
		return &tool.Error{Code: tool.CodeTokenInvalid, Message: "token invalid: missing", Gate: GateToken}
	}
	for i := range r.chain {
		g := &r.chain[i]
		run := g.run
		if st.planning {
			if run = g.plan; run == nil {
				continue
			}
		}
		sp := r.opts.Tracer.Gate(ctx, g.name)
		err := run(r, ctx, st)
		sp.End(errorType(err))
		if err != nil {
			return err
		}
		if st.replay != nil {
			return nil
		}
	}
	return nil
}

// settle gives back what the gates took for a call that did not run: the
// rate limit's token and the idempotency claim (so that a retry can run).
// Deferred, it runs on every way out, a panic included.
func (r *Router) settle(ctx context.Context, st *callState) {
	if !st.ran {
		st.tok.refund()
	}
	if st.stopLease != nil {
		st.stopLease()
	}
	if st.claim != "" {
		if err := r.opts.State.ReleaseIdempotency(context.WithoutCancel(ctx), st.c.Sub, st.d.ID, st.req.IdempotencyKey, st.claim); err != nil {
			r.opts.Logger.Warn("idempotency claim not released; it expires", "tool", st.d.ID, "err", err)
		}
	}
}
