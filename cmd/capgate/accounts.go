package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/upstreamauth"
)

func newAccountsCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "accounts",
		Short: "Each user's own account on the remote MCP servers that need one (auth = \"oauth\" or \"user-token\")",
		Long: `accounts manages the accounts capgate holds for its users on the [mcp.servers]
with auth set, in the store under the config's data_dir (or store.url): link
prints the sign-in link for a user, list shows who is linked where, revoke
forgets a user's account (and has the authorization server revoke it).
The store key (CAPGATE_STORE_KEY or store.key) must be the server's.`,
	}
	cmd.PersistentFlags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml whose store holds the accounts")

	var sub string
	link := &cobra.Command{
		Use:   "link SERVER --sub SUBJECT",
		Short: "Print the link where SUBJECT signs in to SERVER (valid 10 minutes, once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sub == "" {
				return usageError("--sub: say which capgate user signs in")
			}
			return withBroker(configPath, func(ctx context.Context, b *upstreamauth.Broker) error {
				url, until, err := b.Begin(ctx, sub, args[0])
				if err != nil {
					return &exitError{code: exitDenied, err: err}
				}
				if jsonOutput(cmd) {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"sub": sub, "server": args[0], "url": url, "valid_until": until.UTC()})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s signs in to %s at:\n%s\n(valid until %s, once)\n", sub, args[0], url, until.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	link.Flags().StringVar(&sub, "sub", "", "the capgate subject (token sub) whose account it is")
	link.Flags().Bool("json", false, `print one JSON object on stdout: {"sub","server","url","valid_until"}`)

	var listSub string
	var asJSON bool
	list := &cobra.Command{
		Use:   "list --sub SUBJECT",
		Short: "Show SUBJECT's account on every server that signs users in",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listSub == "" {
				return usageError("--sub: say whose accounts to list")
			}
			return withBroker(configPath, func(ctx context.Context, b *upstreamauth.Broker) error {
				accts, err := b.Accounts(ctx, listSub)
				if err != nil {
					return &exitError{code: exitDenied, err: err}
				}
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(accts)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SERVER\tAUTH\tSTATE\tACCOUNT\tTOKEN EXPIRES")
				for _, a := range accts {
					state, expires := "needs sign-in", ""
					if a.Linked {
						state = "linked"
					}
					if a.Mode == upstreamauth.ModeTokenExchange {
						state = "by token exchange"
					}
					if !a.Expiry.IsZero() {
						expires = a.Expiry.UTC().Format(time.RFC3339)
						if a.Refreshable {
							expires += " (refreshable)"
						}
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Server, a.Mode, state, a.Account, expires)
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringVar(&listSub, "sub", "", "the capgate subject")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var revokeSub string
	revoke := &cobra.Command{
		Use:   "revoke SERVER --sub SUBJECT",
		Short: "Forget SUBJECT's account on SERVER, revoking its tokens at the authorization server",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if revokeSub == "" {
				return usageError("--sub: say whose account to revoke")
			}
			return withBroker(configPath, func(ctx context.Context, b *upstreamauth.Broker) error {
				confirmed, err := b.Revoke(ctx, revokeSub, args[0])
				if errors.Is(err, store.ErrNotFound) {
					return &exitError{code: exitDenied, err: fmt.Errorf("%s has no account linked on %s", revokeSub, args[0])}
				}
				if err != nil {
					return &exitError{code: exitDenied, err: err}
				}
				how := "the authorization server has no revocation endpoint or did not confirm"
				if confirmed {
					how = "the authorization server revoked its tokens"
				}
				if jsonOutput(cmd) {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"sub": revokeSub, "server": args[0], "revoked": true, "confirmed": confirmed})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s's account on %s (%s)\n", revokeSub, args[0], how)
				return nil
			})
		},
	}
	revoke.Flags().StringVar(&revokeSub, "sub", "", "the capgate subject")
	revoke.Flags().Bool("json", false, `print one JSON object on stdout: {"sub","server","revoked","confirmed"}, confirmed when the authorization server revoked the tokens`)
	cmd.AddCommand(link, list, revoke)
	return cmd
}

// withBroker opens the config's store and broker for f.
func withBroker(configPath string, f func(context.Context, *upstreamauth.Broker) error) error {
	cfg, err := config.Load(configPath)
	if err != nil {
		return usageError("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, cfg.Server.DataDir, store.Options{URL: cfg.Store.URL})
	if err != nil {
		return &exitError{code: exitDenied, err: fmt.Errorf("%s: store: %w", cfg.Path, err)}
	}
	defer st.Close()
	b, err := app.Broker(cfg, st, slog.New(slog.DiscardHandler), os.LookupEnv)
	if err != nil {
		return usageError("%v", err)
	}
	if b == nil {
		return usageError("%s: no [mcp.servers] has auth = \"oauth\" or \"user-token\"", cfg.Path)
	}
	return f(ctx, b)
}

// accountsView is what `tools list` says of the servers where each user
// signs in: their tools are listed with the credential of the user who
// linked most recently (one user's listing stands for everyone's, every
// call carries the caller's own), and with --sub each says whether that
// subject has linked. Before anyone links, such a server lists nothing:
// unlisted says so.
type accountsView struct {
	st     *store.Store
	b      *upstreamauth.Broker
	names  []string
	linked map[string]bool // by server, for the --sub subject
}

// openAccounts opens the store and broker when cfg has a server with
// auth, and sets its hooks on bo; nil when none has.
func openAccounts(ctx context.Context, cfg *config.Config, bo *sources.BuildOptions) (*accountsView, error) {
	var names []string
	for name, sc := range cfg.MCP.Servers {
		if sc.Auth != "" && sc.Auth != "none" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	st, err := store.Open(ctx, cfg.Server.DataDir, store.Options{URL: cfg.Store.URL})
	if err != nil {
		return nil, &exitError{code: exitDenied, err: fmt.Errorf("%s: store (for the servers where each user signs in): %w", cfg.Path, err)}
	}
	b, err := app.Broker(cfg, st, slog.New(slog.DiscardHandler), os.LookupEnv)
	if err != nil {
		st.Close()
		return nil, usageError("%v", err)
	}
	app.WithAuth(bo, b, nil)
	return &accountsView{st: st, b: b, names: names, linked: map[string]bool{}}, nil
}

func (v *accountsView) close() {
	if v != nil {
		v.st.Close()
	}
}

// stateFor is the state of an auth server's tool for sub ("" for no
// subject: "sign-in per user").
func (v *accountsView) stateFor(ctx context.Context, sub string) func(*tool.Descriptor) string {
	if v == nil {
		return nil
	}
	for _, n := range v.names {
		if sub != "" {
			a, err := v.b.Status(ctx, sub, n)
			v.linked[n] = err == nil && a.Linked
		}
	}
	return func(d *tool.Descriptor) string {
		if d.Kind != tool.KindMCP || !slices.Contains(v.names, d.Source) {
			return ""
		}
		switch {
		case sub == "":
			return "sign-in per user"
		case v.linked[d.Source]:
			return "linked"
		}
		return "needs sign-in"
	}
}

// unlisted prints a line for each auth server with no tool listed: no
// one has linked an account there yet.
func (v *accountsView) unlisted(out io.Writer, tools []*tool.Descriptor) {
	if v == nil {
		return
	}
	for _, n := range v.names {
		if !slices.ContainsFunc(tools, func(d *tool.Descriptor) bool { return d.Kind == tool.KindMCP && d.Source == n }) {
			fmt.Fprintf(out, "%s: needs sign-in: no one has linked an account yet, so its tools are not listed "+
				"(capgate accounts link %s --sub SUBJECT)\n", n, n)
		}
	}
}
