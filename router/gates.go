package router

import (
	"context"

	"github.com/capgate/capgate/audit"
)

// The gates of the chain, in its order (newChain). Each decides one thing
// about the call in st and refuses with a *tool.Error naming its gate.

// resolveGate finds the tool. Whether it exists is the caller's question;
// a skill's scope only narrows what it may do, so its refusal can name
// the skill.
func resolveGate(r *Router, _ context.Context, st *callState) error {
	d, err := r.resolve(st.c, st.req.Tool, st.req.ByID)
	if err != nil {
		return err
	}
	st.c = r.within(st.c, st.req.Scope)
	st.d = d
	resolved(st.ev, d)
	st.ev.ToolName, st.ev.Guarantees = d.ExposedName, guaranteesJSON(d)
	return nil
}

// inputGate reads the input into its canonical form and hash.
func inputGate(_ *Router, _ context.Context, st *callState) error {
	input, value, inputHash, err := parseInput(st.req.Input)
	if err != nil {
		return err
	}
	st.ev.InputSHA256 = inputHash
	st.input, st.value, st.inputHash = input, value, inputHash
	return nil
}

// capabilityGate: the caller's grants allow executing the tool.
func capabilityGate(r *Router, _ context.Context, st *callState) error {
	return r.capabilityGate(st.c, st.d, st.req, st.ev, st.tk)
}

// tierGate: acknowledge, or for a blocked tier an operator's approval
// (requested when missing, except when planning).
func tierGate(r *Router, ctx context.Context, st *callState) (err error) {
	st.needApproval, err = r.tierGate(ctx, st.c, st.d, st.input, st.inputHash, !st.planning)
	return err
}

// chatPolicyGate keeps sensitive tools to their chat types.
func chatPolicyGate(_ *Router, _ context.Context, st *callState) error { return chatGate(st.c, st.d) }

// authGate: a stored credential for (caller, capability, account).
func authGate(r *Router, ctx context.Context, st *callState) error {
	account, err := r.authGate(ctx, st.c, st.d, st.req.Account)
	if err != nil {
		return err
	}
	st.ev.AccountRef, st.account = account, account
	return nil
}

// schemaGate checks the input against the tool's schema.
func schemaGate(r *Router, _ context.Context, st *callState) error {
	return r.schemas.validate(st.d, st.value)
}

// auditHealthGate: the audit log, having admitted the call, may have
// failed since (an fsync); then its record might not be made durable,
// and it does not run. Checked before anything is taken or used.
func auditHealthGate(r *Router, _ context.Context, _ *callState) error { return r.auditGate() }

// rateLimitGate takes a token; settle gives it back if the call does not
// run.
func rateLimitGate(r *Router, ctx context.Context, st *callState) error {
	tok, ok, err := r.limits.take(ctx, st.c.Sub, st.d.ID)
	if err != nil {
		return err
	}
	if !ok {
		return rateLimited(st.c, st.d)
	}
	st.tok = tok
	return nil
}

// rateLimitPlan looks whether the real call would get a token now.
func rateLimitPlan(r *Router, ctx context.Context, st *callState) error {
	ok, err := r.limits.wouldTake(ctx, st.c.Sub, st.d.ID)
	if err != nil {
		return err
	}
	if !ok {
		st.limited = "limited"
		return rateLimited(st.c, st.d)
	}
	st.limited = "ok"
	return nil
}

// idempotencyGate claims the call's key, or finds the result a call with
// it already has (then the chain ends and that result is the answer).
func idempotencyGate(r *Router, ctx context.Context, st *callState) (err error) {
	// A key is honoured for every tool: capgate cannot know that a tool it
	// does not count as mutating changes nothing.
	if st.req.IdempotencyKey == "" {
		return nil
	}
	st.claim, st.replay, err = r.claimKey(ctx, st.c, st.d, st.req.IdempotencyKey, st.inputHash)
	if st.replay != nil {
		st.ran = true // a replay is a call served
		st.ev.Detail = "idempotent replay"
	}
	if err != nil || st.claim == "" {
		return err
	}
	// The claim's lease is renewed while the call runs; settle stops it
	// and releases the claim unless the call kept its result.
	st.stopLease = r.holdLease(st.c.Sub, st.d.ID, st.req.IdempotencyKey, st.claim)
	return nil
}

// approvalGate uses the call's approval, now and only now, and records it.
func approvalGate(r *Router, ctx context.Context, st *callState) error {
	if !st.needApproval {
		return nil
	}
	approval, err := r.useApproval(ctx, st.c, st.d, st.input, st.inputHash, st.req.Progress)
	if err != nil {
		return err
	}
	ev := st.ev
	ev.ApprovalID = approval.ID
	r.record(st.tk, audit.Event{Type: audit.TypeApproval, Sub: st.c.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType,
		Tool: st.d.ID, ToolName: st.d.ExposedName, Decision: "allow", Gate: GateApproval, ApprovalID: approval.ID,
		InputSHA256: st.inputHash, RequestID: st.req.RequestID, Detail: "approval used; approved by " + approval.ApprovedBy})
	return nil
}
