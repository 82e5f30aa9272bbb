package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/connect"
)

func newConnectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "connect URL",
		Short: "Serve a remote capgate's tools, resources and prompts over stdio",
		Long: `connect is a stdio MCP server that forwards to a remote capgate's MCP endpoint
(for example http://host:8787/mcp) over streamable HTTP, with the token from
ASH_CONTEXT_TOKEN or CAPGATE_TOKEN as its bearer token. It is how a sandboxed
runtime reaches the host: the sandbox holds a short-lived token, never a
credential, and the host's router decides every call.`,
		Example: `  CAPGATE_TOKEN=$(capgate token mint --config capgate.toml --sub sandbox) capgate connect http://127.0.0.1:8787/mcp`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok := os.Getenv("ASH_CONTEXT_TOKEN")
			if tok == "" {
				tok = os.Getenv("CAPGATE_TOKEN")
			}
			if tok == "" {
				return usageError("no token: set ASH_CONTEXT_TOKEN or CAPGATE_TOKEN")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			if err := connect.Serve(ctx, args[0], tok, cmd.InOrStdin(), cmd.OutOrStdout(), logger); err != nil && ctx.Err() == nil {
				return &exitError{code: exitDenied, err: err}
			}
			return nil
		},
	}
}
