package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/internal/logbuf"
	"github.com/capgate/capgate/sandbox"
)

// logWindow: serve's log lines that follow one another closer than this
// are written together (internal/logbuf); a line after a quiet spell is
// written at once. A tenth of a second, as the audit log's group commit:
// each window costs a write and a timer that wakes a thread, which at
// 10 ms was still a measurable part of a call's CPU at concurrency 1.
const logWindow = 100 * time.Millisecond

func newServeCmd() *cobra.Command {
	var configPath string
	var stdio bool
	var cpuProfile string
	var logFormat, logLevel string
	var skillsDirs []string
	var listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the catalog behind the router",
		Long: `serve starts the config's sources and serves them, behind the router, as an
MCP server (streamable HTTP at /mcp) and the capability RPC (POST /rpc, and the
Unix socket [server] socket) on [server] listen. Every HTTP request carries
"Authorization: Bearer <token>".

With --stdio it serves one MCP client over stdin and stdout instead, as the
caller whose token is in CAPGATE_TOKEN or ASH_CONTEXT_TOKEN.

SIGINT or SIGTERM stops it gracefully. SIGHUP (or capgate reload, or with
[server] watch_config a change of the config) reloads the config.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageError("--log-level %q: use debug, info, warn or error", logLevel)
			}
			cfg, err := config.Load(configPath)
			if err != nil {
				return usageError("%v", err)
			}
			listenFrom := "[server] listen"
			if a, from := listenOverride(listen); a != "" {
				cfg.Server.Listen, listenFrom = a, from
			}
			if skillsDirs, err = skillDirs(cfg, skillsDirs); err != nil {
				return usageError("%v", err)
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return usageError("%v", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return usageError("%v", err)
				}
				defer pprof.StopCPUProfile()
			}
			// One line per call: under load they are written a window's
			// worth at a time, not one write(2) each.
			logOut := logbuf.New(cmd.ErrOrStderr(), logWindow)
			defer logOut.Flush() // after everything below, app's Close included
			var handler slog.Handler
			switch logFormat {
			case "text":
				handler = slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level})
			case "json":
				handler = slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level})
			default:
				return usageError("--log-format %q: use text or json", logFormat)
			}
			// Warnings and errors are written at once, not a window late.
			logger := slog.New(logbuf.Urgent(handler, logOut, slog.LevelWarn))
			if m := sandbox.BaselineMissing(); m != "" {
				logger.Warn("sandbox baseline not enforced on this kernel", "missing", m)
			}
			// What a killed capgate left of its tools' temp dirs goes now.
			if err := sandbox.PrepareTemp(); err != nil {
				logger.Warn("sandbox temp dirs", "error", err)
			}
			defer sandbox.ReleaseTemp()
			logRunAs(logger, cfg)
			logFileDenials(logger, cfg)
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// An HTTP serve holds its data dir (pid file, socket) alone. A
			// --stdio serve, one per client, shares it and takes no lock.
			if !stdio {
				release, err := holdDataDir(cfg.Server)
				if err != nil {
					return &exitError{code: exitDenied, err: fmt.Errorf("%s: %w", cfg.Path, err)}
				}
				defer release()
			}
			srv, err := app.Open(ctx, cfg, app.Options{Logger: logger, SkillsDirs: skillsDirs})
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			defer srv.Close()
			flagDirs := skillsDirs[len(cfg.SkillDirs):]
			reloads(ctx, logger, srv, configPath, flagDirs, cfg.Server.WatchConfig)
			if stdio {
				tok := os.Getenv("CAPGATE_TOKEN")
				if tok == "" {
					tok = os.Getenv("ASH_CONTEXT_TOKEN")
				}
				if err := srv.ServeStdio(ctx, tok, cmd.InOrStdin(), cmd.OutOrStdout()); err != nil && ctx.Err() == nil {
					return &exitError{code: exitDenied, err: err}
				}
				return nil
			}
			consoleAddr := ""
			if srv.Console != nil {
				if consoleAddr, err = srv.ServeConsole(ctx); err != nil {
					return &exitError{code: exitDenied, err: err}
				}
			}
			err = srv.Serve(ctx, func(addr, socket string) {
				_ = logOut.Flush() // what start logged is out before the banner says it is up
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "capgate %s: %d tools from %s\n", buildinfo.Version(), len(srv.Server.Registry().Snapshot().Tools), cfg.Path)
				fmt.Fprintf(out, "  MCP             http://%s/mcp\n", addr)
				fmt.Fprintf(out, "  capability RPC  http://%s/rpc\n", addr)
				if socket != "" {
					fmt.Fprintf(out, "                  unix://%s\n", socket)
				}
				if m := srv.MetricsAddr(); m != "" {
					fmt.Fprintf(out, "  metrics         http://%s/metrics\n", m)
				}
				if consoleAddr != "" {
					fmt.Fprintf(out, "  console         http://%s/ (sign in: %s console login --config %s)\n", consoleAddr, selfCommand(), configPath)
				}
				fmt.Fprintf(out, "  token key       %s\n", srv.SecretSource)
				if srv.HS256 {
					// A token to paste into a client's config: one that lasts a working day.
					fmt.Fprintf(out, "  a dev token     %s token mint --config %s --sub you --ttl 12h\n", selfCommand(), configPath)
				} else {
					fmt.Fprintf(out, "  a dev token     none: HS256 is off (%s); present a token your issuer signs\n", cfg.Auth.HS256OffBy())
				}
			})
			if errors.Is(err, syscall.EADDRINUSE) {
				// Someone else has the port: the config (or its override)
				// must name another, so it is a configuration error.
				return usageError("%s: %s = %q: the address is already in use; choose another in [server] listen, "+
					"or for this run with serve --listen ADDR or CAPGATE_LISTEN", cfg.Path, listenFrom, cfg.Server.Listen)
			}
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "the address to listen on instead of [server] listen ($CAPGATE_LISTEN too; the flag wins)")
	cmd.Flags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml to serve")
	cmd.Flags().BoolVar(&stdio, "stdio", false, "serve one MCP client over stdin and stdout")
	// warn leaves out the line per call (the audit records every call
	// either way): 3.5-7% of a call's CPU at concurrency 1 (issue 26).
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "the least level logged: debug, info (a line per call), warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "the log's format on stderr: text or json (one line per call, never a token or an argument)")
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile to this file until capgate stops")
	cmd.Flags().StringArrayVar(&skillsDirs, "skills-dir", nil, "a directory of installed skills (repeatable; a later one overrides an earlier one)")
	return cmd
}

// selfCommand is how the user ran capgate: "go run ./cmd/capgate" when the
// binary is one go run built, else "capgate".
func selfCommand() string {
	if strings.Contains(os.Args[0], "go-build") {
		return "go run ./cmd/capgate"
	}
	return "capgate"
}

// listenEnv overrides [server] listen for serve and for the CLI commands
// that find a running capgate through its config.
const listenEnv = "CAPGATE_LISTEN"

// listenOverride is the address --listen (flag) or $CAPGATE_LISTEN gives
// instead of [server] listen, and which one said it; "" for neither.
func listenOverride(flag string) (addr, from string) {
	if flag != "" {
		return flag, "--listen"
	}
	if v := strings.TrimSpace(os.Getenv(listenEnv)); v != "" {
		return v, listenEnv
	}
	return "", ""
}

// logFileDenials has a root capgate read Landlock's audit records, so
// that a call's error names the files the kernel refused its tool, and
// says once at start whether it does; without them a refused file is named
// from the tool's own stderr, checked against its sandbox rules.
func logFileDenials(logger *slog.Logger, cfg *config.Config) {
	const fallback = "file denials are named from what the tool's stderr reports, checked against its sandbox rules, not from the kernel's records"
	if os.Geteuid() != 0 {
		logger.Info(fallback, "why", "reading kernel audit needs root")
		return
	}
	if err := sandbox.WatchFileDenials(cfg.Sandbox.AuditFileDenials); err != nil {
		logger.Info(fallback, "why", err)
		return
	}
	logger.Info("file denials are named in call errors (from Landlock's audit records)")
}

// logRunAs says once, at start, which user a root capgate's tools run as,
// and warns when the operator chose root.
func logRunAs(logger *slog.Logger, cfg *config.Config) {
	switch {
	case os.Geteuid() != 0:
	case app.RunAsRoot(cfg):
		logger.Warn("sandbox.run_as names root: every tool runs as root (without capabilities), so root's files such as /etc/shadow are readable by it",
			"run_as", cfg.Sandbox.RunAs)
	default:
		u := app.RunAs(cfg)
		logger.Info("tools run as an unprivileged user", "run_as", cmp.Or(cfg.Sandbox.RunAs, sandbox.DefaultRunAs), "uid", u.UID, "gid", u.GID)
	}
}
