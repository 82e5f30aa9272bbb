package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/console"
)

func newConsoleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "console",
		Short: "The operator console in a browser ([console] listen)",
	}
	cmd.AddCommand(newConsoleLoginCmd())
	return cmd
}

func newConsoleLoginCmd() *cobra.Command {
	var configPath, sub string
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Print a single-use sign-in link to the console, valid for 10 minutes",
		Long: `login prints a link that signs SUB in to the operator console of the capgate
serving --config, once, within 10 minutes. SUB must be one of [console]
approvers or viewers. The link is signed with capgate's token key (so the
command runs where that key is: the host, with the same environment), and any
replica sharing the store accepts it once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(configPath)
			if err != nil {
				return usageError("%v", err)
			}
			if cfg.Console.Listen == "" {
				return usageError("%s: the console is off: set [console] listen (for example \"127.0.0.1:8788\")", cfg.Path)
			}
			if sub == "" {
				return usageError("--sub: say who signs in")
			}
			if !slices.Contains(cfg.Console.Approvers, sub) && !slices.Contains(cfg.Console.Viewers, sub) {
				return usageError("%s: %q is in neither [console] approvers nor viewers: the console would refuse it", cfg.Path, sub)
			}
			secret, _, err := app.Secret(cfg, os.LookupEnv)
			if errors.Is(err, app.ErrHS256Off) {
				return usageError("%s: sign-in links are signed with capgate's token secret, and HS256 is off here: sign in with the OpenID provider ([console] client_id)", cfg.Path)
			}
			if err != nil {
				return usageError("%v", err)
			}
			tok, err := console.SignInLink(secret, sub, time.Now())
			if err != nil {
				return err
			}
			if jsonOutput(cmd) {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"url": app.ConsoleURL(cfg) + "/login?t=" + tok,
					"sub": sub, "valid_until": time.Now().Add(console.LinkTTL).UTC().Truncate(time.Second)})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/login?t=%s\n", app.ConsoleURL(cfg), tok)
			fmt.Fprintf(cmd.ErrOrStderr(), "signs in %s once, within %s\n", sub, console.LinkTTL)
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml of the capgate serving the console")
	cmd.Flags().StringVar(&sub, "sub", os.Getenv("USER"), "who signs in (one of [console] approvers or viewers)")
	cmd.Flags().Bool("json", false, `print one JSON object on stdout: {"url","sub","valid_until"}`)
	return cmd
}
