package router

import (
	"slices"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// Reachable reports whether c could call d, as far as the gates that
// depend on the caller and the tool alone can tell: d is not quarantined,
// c's grants allow executing it, its tier is allowed, acknowledged by c or
// one an operator approves call by call, and its chat policy admits c's
// chat. Tool search shows a caller only these, so that it never finds a
// tool it could not call. It writes no audit record: nothing is decided.
func (r *Router) Reachable(c *Caller, d *tool.Descriptor) bool {
	if c == nil || d == nil || d.Quarantined != "" {
		return false
	}
	if !c.grants.Allows(r.toolCaps.get(d.ID).execute) {
		return false
	}
	tier, err := r.opts.Risk.ToolTier(d.Risk.Level)
	if err != nil {
		return false
	}
	switch tier.Policy {
	case risk.Allow, risk.Block:
	case risk.AcknowledgeRequired:
		if !slices.Contains(c.acks, tier.Name) {
			return false
		}
	default:
		return false
	}
	return chatGate(c, d) == nil
}
