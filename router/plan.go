package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// Plan is the answer to a planning call (AgentOS's planning mode): what
// every gate decides about the call and what the call would need, with
// nothing run, taken or used: no tool runs, no approval is used or
// requested, no idempotency key is claimed, no rate-limit token is taken.
type Plan struct {
	Tool    string  `json:"tool"` // the tool id once resolved, else the name asked for
	Allowed bool    `json:"allowed"`
	Denial  *Denial `json:"denial,omitempty"` // the first gate that refuses
	// Risk is the tool's level, side effects and tier; absent when the
	// tool was not found.
	Risk *PlanRisk `json:"risk,omitempty"`
	// ApprovalNeeded: the tier blocks the call without an operator's
	// approval. ApprovalReady: an approval of this caller, tool and input
	// is there for the real call to use.
	ApprovalNeeded bool `json:"approval_needed"`
	ApprovalReady  bool `json:"approval_ready"`
	// RateLimit is "ok" or "limited" (whether the real call would get a
	// token now), or "not checked" when an earlier gate refused.
	RateLimit  string     `json:"rate_limit"`
	Guarantees Guarantees `json:"guarantees"`
}

// Denial is a refusal as a planning call reports it: the stable code,
// the gate, what was required and what would allow it.
type Denial struct {
	Code     tool.Code `json:"code"`
	Gate     string    `json:"gate,omitempty"`
	Required string    `json:"required,omitempty"`
	Message  string    `json:"message"`
	Hint     string    `json:"hint,omitempty"`
}

// PlanRisk is what the tool's risk means for the call.
type PlanRisk struct {
	Level       string            `json:"level"`
	SideEffects []risk.SideEffect `json:"side_effects"`
	Tier        string            `json:"tier,omitempty"`
	Policy      risk.Policy       `json:"policy,omitempty"`
	// SideEffectPolicies are the tool's side effects that
	// [policy.side_effects] does not simply allow, and whether the caller
	// acknowledged each.
	SideEffectPolicies []EffectDecision `json:"side_effect_policies"`
}

// Guarantees are who grants what the caller may do: its grant layers,
// child first, and the guarantee source the audit records for it.
type Guarantees struct {
	Source       string   `json:"source,omitempty"`
	Layers       []string `json:"layers"`
	Acknowledged []string `json:"acknowledged"`
}

// Plan runs a call's gates as Call does and stops before anything is
// taken or used (see call's step 1). A refusal is in the Plan, not the
// error; the error is for what stops the planning itself (the audit log
// cannot admit it, an internal failure). It is audited as a plan record.
func (r *Router) Plan(ctx context.Context, c *Caller, req Request) (*Plan, error) {
	start := time.Now()
	ev := audit.Event{Type: audit.TypePlan, ToolName: req.Tool, Protocol: req.Protocol, Via: req.Via, RequestID: req.RequestID,
		ClientInvocationID: req.ClientInvocationID,
		Detail:             "planning: nothing ran"}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	// As for a call: no record, no decision.
	tk, err := r.admit()
	defer tk.Done()
	if err != nil {
		return nil, err
	}
	p := &Plan{Tool: req.Tool, RateLimit: "not checked", Guarantees: Guarantees{Layers: []string{}, Acknowledged: []string{}}}
	err = r.recoverPlan(ctx, c, &req, &ev, &tk, p)
	ev.Duration = time.Since(start)
	var te *tool.Error
	switch {
	case err == nil:
		ev.Decision = "allow"
	case errors.As(err, &te) && te.Code != tool.CodeInternal:
		ev.Decision, ev.Code, ev.Gate = "deny", string(te.Code), te.Gate
		p.Denial = &Denial{Code: te.Code, Gate: te.Gate, Required: te.Required, Message: te.Message, Hint: te.Hint}
		err = nil
	default:
		ev.Decision, ev.Code = "error", string(tool.CodeInternal)
		if !isToolError(err) {
			r.opts.Logger.Error("planning call failed", "tool", ev.Tool, "sub", ev.Sub, "err", err)
			err = tool.Wrap(err, tool.CodeInternal, "internal error")
		}
		p = nil
	}
	r.record(&tk, ev)
	return p, err
}

func (r *Router) recoverPlan(ctx context.Context, c *Caller, req *Request, ev *audit.Event, tk *audit.Ticket, p *Plan) (err error) {
	defer r.recovered(ev, "planning call", &err)
	st := callState{c: c, req: req, ev: ev, tk: tk, planning: true}
	err = r.runChain(ctx, &st)
	if st.c != nil {
		p.Guarantees.Source = st.c.guarantee
		p.Guarantees.Layers = append(p.Guarantees.Layers, st.c.layers...)
		p.Guarantees.Acknowledged = append(p.Guarantees.Acknowledged, st.c.acks...)
	}
	if d := st.d; d != nil {
		p.Tool = d.ID
		pr := &PlanRisk{Level: d.Risk.Level.String(), SideEffects: d.Risk.Effects, SideEffectPolicies: r.effectDecisions(st.c, d)}
		if tier, terr := r.opts.Risk.ToolTier(d.Risk.Level); terr == nil {
			pr.Tier, pr.Policy = tier.Name, tier.Policy
			p.ApprovalNeeded = tier.Policy == risk.Block
		}
		if pr.SideEffects == nil {
			pr.SideEffects = []risk.SideEffect{}
		}
		p.Risk = pr
	}
	p.ApprovalReady = st.needApproval
	if st.limited != "" {
		p.RateLimit = st.limited
	}
	if err != nil {
		return err
	}
	p.Allowed = true
	return nil
}

// approvalPlanned is a planning call's refusal at a blocked tier without
// an approval: the real call's approval_required, with no request made.
func approvalPlanned(d *tool.Descriptor, tier risk.Tier) error {
	return &tool.Error{Code: tool.CodeApprovalRequired, Gate: GateApproval, Required: tier.Name,
		Message: fmt.Sprintf("%s is risk %s, tier %s: an operator must approve this call (planning requested no approval)",
			d.ID, d.Risk.Level, tier.Name),
		Hint: "make the call without planning mode to request an approval, which an operator gives with `capgate approve` on the host; then retry the same call with the same input"}
}
