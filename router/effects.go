package router

import (
	"context"
	"fmt"
	"slices"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// EffectDecision is what [policy.side_effects] says of one of a tool's
// side effects for a caller, as planning shows it.
type EffectDecision struct {
	Effect       risk.SideEffect   `json:"effect"`
	Policy       risk.EffectPolicy `json:"policy"`
	Acknowledged bool              `json:"acknowledged,omitempty"`
}

// effectDecisions lists d's side effects that the policy does not simply
// allow, in d's order, with whether c acknowledged each.
func (r *Router) effectDecisions(c *Caller, d *tool.Descriptor) []EffectDecision {
	out := []EffectDecision{}
	for _, e := range d.Risk.Effects {
		p, ok := r.opts.Policy.SideEffects[e]
		if !ok || p == risk.EffectAllow {
			continue
		}
		out = append(out, EffectDecision{Effect: e, Policy: p, Acknowledged: c != nil && slices.Contains(c.acks, string(e))})
	}
	return out
}

// sideEffectsGate enforces [policy.side_effects] on the tool's side
// effects: a denied one refuses every call, an acknowledged one needs the
// caller to have acknowledged the tag. A denial comes first, whatever the
// order of the tags, so the answer does not send the caller after an
// acknowledgement that would not help. It only looks, so planning runs it.
func sideEffectsGate(r *Router, _ context.Context, st *callState) error {
	if len(r.opts.Policy.SideEffects) == 0 || len(st.d.Risk.Effects) == 0 {
		return nil
	}
	decisions := r.effectDecisions(st.c, st.d)
	for _, e := range decisions {
		if e.Policy != risk.EffectAcknowledge { // deny, or a policy it does not know: fail closed
			return &tool.Error{Code: tool.CodeAccessDenied, Gate: GateSideEffects, Required: string(e.Effect),
				Message: fmt.Sprintf("%s has side effect %s, which [policy.side_effects] denies for every caller", st.d.ID, e.Effect),
				Hint:    fmt.Sprintf("an operator sets [policy.side_effects] %q to \"acknowledge\" or \"allow\", or corrects the tool's side effects in capgate.toml", e.Effect)}
		}
	}
	for _, e := range decisions {
		if e.Policy == risk.EffectAcknowledge && !e.Acknowledged {
			return &tool.Error{Code: tool.CodeAcknowledgeNeeded, Gate: GateSideEffects, Required: string(e.Effect),
				Message: fmt.Sprintf("%s has side effect %s: the caller has not acknowledged %s", st.d.ID, e.Effect, e.Effect),
				Hint:    fmt.Sprintf("acknowledge %q: the token's ack claim, [policy] acknowledge or [policy.subjects.%s] acknowledge", e.Effect, st.c.Sub)}
		}
	}
	return nil
}
