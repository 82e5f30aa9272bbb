package risk

import (
	"fmt"
	"slices"
	"strings"

	"github.com/capgate/capgate/permissions"
)

// GrantReport is the verdict on one grant.
type GrantReport struct {
	Grant        string   `json:"grant"`
	Tier         string   `json:"tier,omitempty"` // "" when unclassified
	Policy       Policy   `json:"policy,omitempty"`
	Pattern      string   `json:"pattern,omitempty"` // the classification pattern that matched
	Description  string   `json:"description,omitempty"`
	Acknowledged bool     `json:"acknowledged"`
	Active       bool     `json:"active"`            // false when refused
	Refused      string   `json:"refused,omitempty"` // why it is not active
	Warnings     []string `json:"warnings,omitempty"`
}

// Evaluation is the verdict on a grant set.
type Evaluation struct {
	Grants       []GrantReport `json:"grants"`
	Acknowledged []string      `json:"acknowledged,omitempty"`
}

// Active returns the grants that remain in force.
func (e *Evaluation) Active() []string {
	var out []string
	for _, g := range e.Grants {
		if g.Active {
			out = append(out, g.Grant)
		}
	}
	return out
}

// Refused returns the reports of the grants that were refused.
func (e *Evaluation) Refused() []GrantReport {
	var out []GrantReport
	for _, g := range e.Grants {
		if !g.Active {
			out = append(out, g)
		}
	}
	return out
}

// Set compiles the active grants.
func (e *Evaluation) Set() (*permissions.Set, error) {
	return permissions.NewSet(e.Active()...)
}

// Evaluate classifies each grant and applies its tier's policy:
//   - block: refused unless the tier is acknowledged explicitly;
//   - acknowledge_required: refused unless the tier is acknowledged (Rye:
//     "without <acknowledge>, elevated capabilities are denied even if the
//     capability string pattern matches");
//   - allow: active.
//
// Broad grants (ending ".*" with two dots or fewer, or starting with a
// wildcard) carry a warning whatever their tier. An acknowledgement of a
// tier the table does not have is an error: it is always a typing mistake.
// A side-effect tag may be acknowledged too ([policy.side_effects]
// "fs.delete" = "acknowledge"); it acknowledges no tier.
func (t *Table) Evaluate(grants, acknowledged []string) (*Evaluation, error) {
	for _, a := range acknowledged {
		if _, ok := t.Tier(a); !ok && !slices.Contains(SideEffects, SideEffect(a)) {
			return nil, fmt.Errorf("acknowledged tier %q is not in %s; tiers are %s (or acknowledge a side-effect tag such as fs.delete)", a, t.Name, strings.Join(t.TierNames(), ", "))
		}
	}
	e := &Evaluation{Acknowledged: acknowledged}
	for _, g := range grants {
		pg, err := permissions.ParseGrant(g)
		if err != nil {
			return nil, err
		}
		g = pg.String()
		c := t.Classify(g)
		r := GrantReport{Grant: g, Active: true}
		if c.Widened != "" {
			r.Warnings = append(r.Warnings, fmt.Sprintf("has a wildcard before its end: classified as %s", c.Widened))
		}
		if !c.Classified {
			if permissions.Compile(g).Literal() && !strings.HasPrefix(g, ryePrefix) {
				r.Warnings = append(r.Warnings, "matches no capability string: they all start with rye.")
			} else {
				r.Warnings = append(r.Warnings, "unclassified: no pattern of the risk table matches it")
			}
		} else {
			r.Tier, r.Policy, r.Pattern, r.Description = c.Tier.Name, c.Tier.Policy, c.Pattern, c.Description
			// Acknowledging an "allow" tier changes nothing, so it is not reported.
			r.Acknowledged = c.Tier.Policy != Allow && slices.Contains(acknowledged, c.Tier.Name)
			switch {
			case c.Tier.Policy == Block && !r.Acknowledged:
				r.Active = false
				r.Refused = fmt.Sprintf("tier %s (%s) is blocked: acknowledge %s to allow this grant",
					c.Tier.Name, describe(c), c.Tier.Name)
			case c.Tier.Policy == AcknowledgeRequired && !r.Acknowledged:
				r.Active = false
				r.Refused = fmt.Sprintf("tier %s (%s) needs acknowledgement: acknowledge %s to allow this grant",
					c.Tier.Name, describe(c), c.Tier.Name)
			}
		}
		if isBroad(g) {
			r.Warnings = append(r.Warnings, "broad grant: consider narrowing it")
		}
		e.Grants = append(e.Grants, r)
	}
	return e, nil
}

func describe(c Class) string {
	if c.Description != "" {
		return c.Description
	}
	return "pattern " + c.Pattern
}

// isBroad reports grants that reach a whole primary or more.
func isBroad(g string) bool {
	if strings.HasSuffix(g, ".*") && strings.Count(g, ".") <= 2 {
		return true
	}
	p := permissions.Compile(g)
	return !p.Literal() && len(p.Prefix()) < len(ryePrefix)
}
