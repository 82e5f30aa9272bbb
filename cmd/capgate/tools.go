package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/tool"
)

func newToolsCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "List, search, show and pin the tools of the catalog",
		Long: `tools reads the config (--config, default ./capgate.toml), starts its sources
(extension packs, bridge providers, upstream MCP servers) and works on the
merged catalog.`,
	}
	cmd.PersistentFlags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml to read")
	var accounts *accountsView // the per-user sign-in state, when a server has auth
	open := func(cmd *cobra.Command, ignoreLock bool) (*registry.Registry, *config.Config, error) {
		cfg, err := config.Load(configPath)
		if err != nil {
			return nil, nil, usageError("%v", err)
		}
		logger := cliLogger(cmd, cmd.ErrOrStderr())
		// Listing calls no operation, so providers get random keys, never
		// the token key.
		bo := app.RegistryOptions(cfg)
		bo.Logger = logger
		if ignoreLock {
			bo.LockPath, bo.RequireLock = "", false
		}
		if accounts, err = openAccounts(cmd.Context(), cfg, &bo); err != nil {
			return nil, nil, err
		}
		r, err := sources.Build(context.Background(), bo)
		if err != nil {
			return nil, nil, usageError("%v", err)
		}
		return r, cfg, nil
	}

	var f listFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the catalog's tools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter()
			if err != nil {
				return err
			}
			r, _, err := open(cmd, false)
			if err != nil {
				return err
			}
			defer r.Close()
			defer accounts.close()
			tools := r.Snapshot().List(filter)
			if f.json {
				return printTools(cmd.OutOrStdout(), tools, true, nil)
			}
			if err := printTools(cmd.OutOrStdout(), tools, false, accounts.stateFor(cmd.Context(), f.sub)); err != nil {
				return err
			}
			accounts.unlisted(cmd.OutOrStdout(), tools)
			return nil
		},
	}
	list.Flags().StringVar(&f.riskMax, "risk-max", "", "only tools at or below this level (LOW, MED, HIGH, CRITICAL)")
	list.Flags().StringArrayVar(&f.exclude, "exclude-side-effect", nil, "leave out tools with this side effect (repeatable)")
	list.Flags().StringArrayVar(&f.kinds, "source", nil, "only tools of this source kind: ext, bridge, mcp (repeatable)")
	list.Flags().BoolVar(&f.available, "available", false, "only tools that can be called now")
	list.Flags().BoolVar(&f.json, "json", false, "print JSON")
	list.Flags().StringVar(&f.sub, "sub", "", "for servers where each user signs in: show whether this subject has (linked) or not (needs sign-in)")

	var searchJSON bool
	search := &cobra.Command{
		Use:   "search QUERY",
		Short: "Find tools whose id, name or description contains QUERY (any case)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, _, err := open(cmd, false)
			if err != nil {
				return err
			}
			defer r.Close()
			return printTools(cmd.OutOrStdout(), r.Snapshot().List(registry.Filter{Query: args[0]}), searchJSON, nil)
		},
	}
	search.Flags().BoolVar(&searchJSON, "json", false, "print JSON")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one tool, by id (mcp:server:tool) or exposed name, as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, _, err := open(cmd, false)
			if err != nil {
				return err
			}
			defer r.Close()
			s := r.Snapshot()
			d, ok := s.Lookup(args[0])
			if !ok {
				d, ok = s.ByExposedName(args[0])
			}
			if !ok {
				return &exitError{code: exitDenied, err: fmt.Errorf("no tool %q in the catalog (capgate tools search finds tools)", args[0])}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(d)
		},
	}

	lock := &cobra.Command{
		Use:   "lock",
		Short: "Pin every tool's definition in capgate.lock, beside the config",
		Long: `lock writes capgate.lock: one line per tool with a hash of its name,
description, schemas and annotations. At serve time a tool whose definition
no longer matches its pin is quarantined until the lock is written again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, cfg, err := open(cmd, true)
			if err != nil {
				return err
			}
			defer r.Close()
			tools := r.Snapshot().Tools
			var pinned []*tool.Descriptor
			skipped := []string{}
			for _, d := range tools {
				if d.Available {
					pinned = append(pinned, d)
				} else if skipped = append(skipped, d.ID); !jsonOutput(cmd) {
					fmt.Fprintf(cmd.ErrOrStderr(), "capgate: not pinning %s: its source is unavailable\n", d.ID)
				}
			}
			path := app.LockPath(cfg)
			if err := r.Snapshot().Lock(pinned).Write(path); err != nil {
				return err
			}
			if jsonOutput(cmd) {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"file": path, "pinned": len(pinned), "skipped": skipped})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pinned %d tools in %s\n", len(pinned), path)
			return nil
		},
	}
	show.Flags().Bool("json", false, "fail with a JSON error line too (the tool is JSON already)")
	lock.Flags().Bool("json", false, `print one JSON object on stdout: {"file","pinned","skipped"}, skipped naming the tools of sources that did not answer`)
	cmd.AddCommand(list, search, show, lock)
	return cmd
}

type listFlags struct {
	riskMax   string
	exclude   []string
	kinds     []string
	available bool
	json      bool
	sub       string // --sub: the sign-in state of this subject
}

func (f listFlags) filter() (registry.Filter, error) {
	var out registry.Filter
	var err error
	if f.riskMax != "" {
		if out.MaxRisk, err = risk.ParseLevel(f.riskMax); err != nil {
			return out, usageError("--risk-max: %v", err)
		}
	}
	if out.ExcludeEffects, err = risk.ParseSideEffects(f.exclude); err != nil {
		return out, usageError("--exclude-side-effect: %v", err)
	}
	for _, k := range f.kinds {
		kind, err := tool.ParseKind(k)
		if err != nil {
			return out, usageError("--source: %v", err)
		}
		out.Kinds = append(out.Kinds, kind)
	}
	out.AvailableOnly = f.available
	return out, nil
}

// printTools prints tools; state, when set, says the state of a tool of a
// server where each user signs in.
func printTools(out io.Writer, tools []*tool.Descriptor, asJSON bool, state func(*tool.Descriptor) string) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if tools == nil {
			tools = []*tool.Descriptor{}
		}
		return enc.Encode(tools)
	}
	if len(tools) == 0 {
		fmt.Fprintln(out, "no tools")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tRISK\tSIDE EFFECTS\tSTATE")
	stateOf := state
	for _, d := range tools {
		state := "available"
		switch {
		case d.Quarantined != "":
			state = "quarantined"
		case !d.Available:
			state = "unavailable"
		}
		if stateOf != nil {
			if s := stateOf(d); s != "" {
				state += ", " + s
			}
		}
		effects := make([]string, len(d.Risk.Effects))
		for i, e := range d.Risk.Effects {
			effects[i] = string(e)
		}
		eff := strings.Join(effects, ",")
		if eff == "" {
			eff = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%s\n", d.ExposedName, d.ID, d.Risk.Level, d.Risk.LevelFrom, eff, state)
	}
	return tw.Flush()
}
