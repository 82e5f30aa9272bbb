package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/risk"
)

// readDirective reads a directive file's <permissions> block.
func readDirective(path string) (*permissions.Permissions, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return permissions.ParseDirective(path, src)
}

type checkOptions struct {
	grants    []string
	acks      []string
	directive string
	riskFile  string
	json      bool
}

func newCheckCmd() *cobra.Command {
	var o checkOptions
	cmd := &cobra.Command{
		Use:   "check [flags] PRIMARY TYPE [ID]",
		Short: "Decide whether grants allow a capability",
		Long: `check builds the capability string that PRIMARY (execute, fetch, sign) on the
item ID of TYPE (tool, directive, knowledge) requires, and decides it against
the grants, as the router would:

  - each grant is classified into a tier by the risk file; a grant in a
    "block" or "acknowledge_required" tier is refused unless that tier is
    acknowledged (--ack);
  - with --directive, the directive's <permissions> attenuate the --grant
    set: a capability must be allowed by both (with no --grant, the
    directive's grants alone decide).

Exit status: 0 allowed, 1 denied, 2 bad input.`,
		Example: `  capgate check --grant 'rye.execute.tool.mcp.filesystem.*' execute tool mcp:filesystem:read_file
  capgate check --grant 'rye.*' --ack unrestricted fetch directive
  capgate check --directive deploy.md --json execute tool bridge:gog:email.send`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCheck(cmd.OutOrStdout(), o, args)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.grants, "grant", nil, "a granted capability pattern (repeatable)")
	f.StringArrayVar(&o.acks, "ack", nil, "an acknowledged risk tier (repeatable)")
	f.StringVar(&o.directive, "directive", "", "a directive file whose <permissions> block attenuates the grants")
	f.StringVar(&o.riskFile, "risk-file", "", "a capability_risk.yaml to use instead of the built-in one")
	f.BoolVar(&o.json, "json", false, "print the decision as JSON")
	return cmd
}

// checkResult is what check prints, as text or JSON.
type checkResult struct {
	Required  string             `json:"required"`
	Allowed   bool               `json:"allowed"`
	Matched   []string           `json:"matched,omitempty"` // one grant per layer, directive first
	Reason    string             `json:"reason"`
	Grants    *risk.Evaluation   `json:"grants,omitempty"`
	Directive *directiveDecision `json:"directive,omitempty"`
	// Blocked lists refused grants that would have matched.
	Blocked []risk.GrantReport `json:"blocked,omitempty"`
	// Suggest lists grants that would allow the capability.
	Suggest []string `json:"suggest,omitempty"`
}

type directiveDecision struct {
	File   string           `json:"file"`
	Grants *risk.Evaluation `json:"grants"`
}

func runCheck(out io.Writer, o checkOptions, args []string) error {
	primary, err := permissions.ParsePrimary(args[0])
	if err != nil {
		return usageError("%v", err)
	}
	itemType, err := permissions.ParseItemType(args[1])
	if err != nil {
		return usageError("%v", err)
	}
	id := ""
	if len(args) == 3 {
		if id = strings.TrimSpace(args[2]); id == "" {
			return usageError("the item ID is empty; leave it out to check rye.%s.%s", primary, itemType)
		}
	}
	table, err := app.RiskTable(o.riskFile)
	if err != nil {
		return usageError("%v", err)
	}
	res := checkResult{Required: permissions.Required(primary, itemType, id)}

	var layers []*permissions.Set
	var refused []risk.GrantReport
	if o.directive != "" {
		perms, err := readDirective(o.directive)
		if err != nil {
			return usageError("%v", err)
		}
		ev, err := table.Evaluate(perms.Grants, union(o.acks, perms.Tiers()))
		if err != nil {
			return usageError("%s: %v", o.directive, err)
		}
		set, err := ev.Set()
		if err != nil {
			return usageError("%s: %v", o.directive, err)
		}
		res.Directive = &directiveDecision{File: o.directive, Grants: ev}
		layers = append(layers, set)
		refused = append(refused, ev.Refused()...)
	}
	if len(o.grants) > 0 || o.directive == "" {
		ev, err := table.Evaluate(o.grants, o.acks)
		if err != nil {
			return usageError("%v", err)
		}
		set, err := ev.Set()
		if err != nil {
			return usageError("%v", err)
		}
		res.Grants = ev
		layers = append(layers, set)
		refused = append(refused, ev.Refused()...)
	}
	set := layers[0]
	if len(layers) == 2 {
		set = permissions.Intersect(layers[0], layers[1])
	}
	d := set.Check(res.Required)
	res.Allowed, res.Matched, res.Reason = d.Allowed, d.Matched, d.Reason()
	if !d.Allowed {
		if len(o.grants) == 0 && o.directive == "" {
			res.Reason = res.Required + " is denied: no grants given (no grant means deny everything)"
		} else if len(layers) == 2 {
			side := "--grant set"
			if d.Layer == 0 {
				side = "directive " + o.directive
			}
			res.Reason = fmt.Sprintf("%s is denied: no grant of the %s matches it", res.Required, side)
		}
		for _, r := range refused {
			if permissions.Match(r.Grant, res.Required) {
				res.Blocked = append(res.Blocked, r)
			}
		}
		res.Suggest = suggest(table, o.acks, res.Required, id)
	}

	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printCheck(out, res)
	}
	if !res.Allowed {
		return &exitError{code: exitDenied}
	}
	return nil
}

// suggest offers the exact capability and, for an item id, its siblings'
// wildcard, as grants that would allow it.
// suggest lists the grants that would allow required, leaving out a
// wildcard the risk table would itself refuse under acks (an elevated
// "rye.execute.directive.*" without --ack elevated).
func suggest(table *risk.Table, acks []string, required, id string) []string {
	out := []string{required}
	if id != "" {
		if i := strings.LastIndexByte(required, '.'); i > 0 {
			wide := required[:i+1] + "*"
			if ev, err := table.Evaluate([]string{wide}, acks); err == nil && len(ev.Active()) == 1 {
				out = append(out, wide)
			}
		}
	}
	return out
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func printCheck(out io.Writer, r checkResult) {
	if r.Allowed {
		fmt.Fprintf(out, "allowed: %s\n", r.Required)
		if len(r.Matched) == 1 {
			fmt.Fprintf(out, "  by grant %s\n", r.Matched[0])
		} else {
			fmt.Fprintf(out, "  by directive grant %s and grant %s\n", r.Matched[0], r.Matched[1])
		}
	} else {
		fmt.Fprintf(out, "denied: %s\n", r.Required)
		fmt.Fprintf(out, "  %s\n", strings.TrimPrefix(r.Reason, r.Required+" is denied: "))
		for _, b := range r.Blocked {
			fmt.Fprintf(out, "  grant %s would match, but it is refused: %s\n", b.Grant, b.Refused)
		}
		fmt.Fprintf(out, "  to allow it, grant %s\n", strings.Join(r.Suggest, " or "))
	}
	if r.Directive != nil {
		fmt.Fprintf(out, "\ndirective %s:\n", r.Directive.File)
		printGrants(out, r.Directive.Grants)
	}
	if r.Grants != nil && len(r.Grants.Grants) > 0 {
		fmt.Fprintf(out, "\ngrants:\n")
		printGrants(out, r.Grants)
	}
}

// printGrants prints one line per grant with its tier and policy, then
// its warnings or why it is refused.
func printGrants(out io.Writer, e *risk.Evaluation) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, g := range e.Grants {
		tier, policy := g.Tier, string(g.Policy)
		if tier == "" {
			tier, policy = "unclassified", "-"
		}
		state := "active"
		switch {
		case !g.Active:
			state = "REFUSED"
		case g.Acknowledged:
			state = "active, acknowledged"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", g.Grant, tier, policy, state)
	}
	tw.Flush()
	for _, g := range e.Grants {
		if g.Refused != "" {
			fmt.Fprintf(out, "  %s: refused: %s\n", g.Grant, g.Refused)
		}
		for _, w := range g.Warnings {
			fmt.Fprintf(out, "  %s: warning: %s\n", g.Grant, w)
		}
	}
}
