package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/risk"
)

type permsOptions struct {
	riskFile string
	json     bool
}

func newPermsCmd() *cobra.Command {
	var o permsOptions
	cmd := &cobra.Command{
		Use:   "perms [flags] FILE",
		Short: "Print a directive's capability strings with their tiers",
		Long: `perms reads the <permissions> block of a directive (any text file: markdown,
XML) and prints each capability string with its risk tier, the tier's policy
and any warning, taking the directive's own <acknowledge> elements into
account.

Exit status: 0 when every grant is in force, 1 when the risk policy refuses
one (a "block" tier not acknowledged), 2 on a file that cannot be read.`,
		Example: `  capgate perms directives/deploy.md
  capgate perms --json directives/deploy.md`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPerms(cmd.OutOrStdout(), o, args[0])
		},
	}
	cmd.Flags().StringVar(&o.riskFile, "risk-file", "", "a capability_risk.yaml to use instead of the built-in one")
	cmd.Flags().BoolVar(&o.json, "json", false, "print as JSON")
	return cmd
}

type permsResult struct {
	File string `json:"file"`
	Line int    `json:"line"`
	*risk.Evaluation
}

func runPerms(out io.Writer, o permsOptions, path string) error {
	table, err := app.RiskTable(o.riskFile)
	if err != nil {
		return usageError("%v", err)
	}
	perms, err := readDirective(path)
	if err != nil {
		return usageError("%v", err)
	}
	ev, err := table.Evaluate(perms.Grants, perms.Tiers())
	if err != nil {
		return usageError("%s:%d: %v", path, perms.Line, err)
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(permsResult{File: path, Line: perms.Line, Evaluation: ev}); err != nil {
			return err
		}
	} else {
		acks := "acknowledges nothing"
		if len(perms.Acknowledge) > 0 {
			acks = "acknowledges " + strings.Join(perms.Tiers(), ", ")
		}
		noun := "capability strings"
		if len(ev.Grants) == 1 {
			noun = "capability string"
		}
		fmt.Fprintf(out, "%s:%d: %d %s; %s\n", path, perms.Line, len(ev.Grants), noun, acks)
		if len(ev.Grants) == 0 {
			fmt.Fprintln(out, "  (none: this directive may do nothing)")
		} else {
			printGrants(out, ev)
		}
	}
	if len(ev.Refused()) > 0 {
		return &exitError{code: exitDenied}
	}
	return nil
}
