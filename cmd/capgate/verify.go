package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/tool"
)

func newVerifyCmd() *cobra.Command {
	var path string
	var prod, allowUnsafe, asJSON bool
	cmd := &cobra.Command{
		Use:   "verify --prod --config FILE",
		Short: "Check that a config is fit for production",
		Long: `verify --prod reads the config as capgate serve does, starts its sources to
see their tools (as capgate tools list does), and reports, one a line, what an
operator should not ship:

  - every problem capgate config check reports;
  - allow_unsafe_execution in [capability_overrides] (unless --allow-unsafe);
  - a tool whose guarantees this kernel cannot enforce, a kernel that cannot
    enforce the baseline every tool gets, and a tool that declares nothing;
  - a source that does not answer (an upstream MCP server down);
  - the development token key: HS256 accepted and the key's variable
    (auth.secret_env) unset here, so serve would use <data_dir>/token.secret;
  - anonymous access ([auth.anonymous]);
  - [sandbox] run_as naming root, which keeps a root capgate's tools root;
  - policy.require_lock without capgate.lock, or a tool it does not pin;
  - a tool capgate.lock pins only in part (a pin from before capgate pinned
    launches or the files a run names): run capgate tools lock;
  - key files and the data dir readable by others, a config others can write.

It checks the environment and kernel it runs in: run it where serve runs.

Exit status: 0 fit ("FILE: fit for production" on stdout), 1 not (each
problem on stderr), 2 bad usage. With --json, stdout holds one object
{"file","ok","problems"} either way.`,
		Example: `  capgate verify --prod --config capgate.toml
  capgate verify --prod --config capgate.toml --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !prod {
				return usageError("--prod is required: it is the one check verify makes so far")
			}
			if path == "" {
				return usageError("--config is required")
			}
			problems := prodProblems(cliLogger(cmd, cmd.ErrOrStderr()), path, allowUnsafe, os.LookupEnv)
			if asJSON {
				return printVerifyJSON(cmd.OutOrStdout(), path, problems)
			}
			if len(problems) == 0 {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: fit for production\n", path)
				return err
			}
			for _, p := range problems {
				fmt.Fprintln(cmd.ErrOrStderr(), p)
			}
			return &exitError{code: exitDenied, err: fmt.Errorf("%s: not fit for production", path)}
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "the config file to verify (required)")
	cmd.Flags().BoolVar(&prod, "prod", false, "check for production")
	cmd.Flags().BoolVar(&allowUnsafe, "allow-unsafe", false, "accept allow_unsafe_execution overrides")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print one JSON object on stdout: {"file","ok","problems"}, problems as the text prints them`)
	return cmd
}

// verifyResult is what `verify --prod --json` prints; the exit status is
// the text form's (0 fit, 1 not).
type verifyResult struct {
	File     string   `json:"file"`
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"` // "file[:line]: key: problem", as the text form prints them
}

func printVerifyJSON(out io.Writer, path string, problems []string) error {
	res := verifyResult{File: path, OK: len(problems) == 0, Problems: append([]string{}, problems...)}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	if !res.OK {
		return &exitError{code: exitDenied}
	}
	return nil
}

// prodProblems is every reason the config at path is not fit for
// production, as "file[:line]: key: problem" lines.
func prodProblems(log *slog.Logger, path string, allowUnsafe bool, lookup func(string) (string, bool)) []string {
	cfg, src, out := checkConfig(path)
	if len(out) > 0 {
		return out // the rest needs a config that loads
	}
	add := func(key, format string, args ...any) {
		out = append(out, fmt.Sprintf("%s: %s: %s", cfg.Path, key, fmt.Sprintf(format, args...)))
	}

	for _, id := range slices.Sorted(maps.Keys(cfg.CapabilityOverrides)) {
		if v, _ := cfg.CapabilityOverrides[id]["allow_unsafe_execution"].(bool); v && !allowUnsafe {
			add(`capability_overrides."`+id+`".allow_unsafe_execution`,
				"%s may run without the kernel's proof of its guarantees (--allow-unsafe accepts it)", id)
		}
	}
	if cfg.Auth.HS256() {
		if v, ok := lookup(cfg.Auth.SecretEnv); !ok || strings.TrimSpace(v) == "" {
			add("auth.secret_env", "$%s is unset here, so serve would sign and accept tokens with the development key %s; set $%s or use a JWKS",
				cfg.Auth.SecretEnv, filepath.Join(cfg.Server.DataDir, app.DevSecretFile), cfg.Auth.SecretEnv)
		}
	}
	if cfg.Auth.Anonymous != nil {
		add("auth.anonymous", "callers without a token are let in")
	}
	if app.RunAsRoot(cfg) {
		add("sandbox.run_as", "%q keeps a root capgate's tools root (without capabilities): root's files such as /etc/shadow are readable by them; remove it to run them as %s",
			cfg.Sandbox.RunAs, sandbox.DefaultRunAs)
	}
	if cfg.Policy.RequireLock {
		if _, err := os.Stat(app.LockPath(cfg)); err != nil {
			add("policy.require_lock", "%s is missing: no tool is pinned (run capgate tools lock)", app.LockPath(cfg))
		}
	}
	out = append(out, permissionProblems(cfg)...)
	out = append(out, toolProblems(log, cfg, allowUnsafe)...)
	return withLines(src, out)
}

// permissionProblems: the key file and data dir readable by others, the
// config writable by others.
func permissionProblems(cfg *config.Config) []string {
	var out []string
	mode := func(p string) (fs.FileMode, bool) {
		fi, err := os.Stat(p)
		if err != nil {
			return 0, false
		}
		return fi.Mode().Perm(), true
	}
	key := filepath.Join(cfg.Server.DataDir, app.DevSecretFile)
	if m, ok := mode(key); ok && m&0o077 != 0 {
		out = append(out, fmt.Sprintf("%s: server.data_dir: the token key %s is readable by others (mode %04o): chmod 600 %s", cfg.Path, key, m, key))
	}
	if m, ok := mode(cfg.Server.DataDir); ok && m&0o007 != 0 {
		out = append(out, fmt.Sprintf("%s: server.data_dir: %s is open to others (mode %04o): chmod 700 %s", cfg.Path, cfg.Server.DataDir, m, cfg.Server.DataDir))
	}
	if m, ok := mode(cfg.Path); ok && m&0o022 != 0 {
		out = append(out, fmt.Sprintf("%s: the config is writable by others (mode %04o): chmod go-w %s", cfg.Path, m, cfg.Path))
	}
	return out
}

// declareWhere says where d's capabilities are declared.
func declareWhere(d *tool.Descriptor) string {
	switch d.Kind {
	case tool.KindExt:
		return fmt.Sprintf("commands.%s.capabilities in pack %s's extension.yaml", d.Name, d.Source)
	case tool.KindBridge:
		return fmt.Sprintf("capabilities in the [capabilities.providers] table of namespace %s", d.Source)
	}
	return fmt.Sprintf("[mcp.servers.%s] capabilities", d.Source)
}

// toolProblems starts the sources and reports each tool a lock does not
// pin under require_lock, and each whose guarantees are not enforced here
// (unless the operator allows it to run unsafe and allowUnsafe).
func toolProblems(log *slog.Logger, cfg *config.Config, allowUnsafe bool) []string {
	bo := app.RegistryOptions(cfg)
	bo.Logger = log
	r, err := sources.Build(context.Background(), bo)
	if err != nil {
		return []string{fmt.Sprintf("%s: the sources: %v", cfg.Path, err)}
	}
	defer r.Close()
	var out []string
	if m := sandbox.BaselineMissing(); m != "" {
		out = append(out, fmt.Sprintf("%s: sandbox: the baseline of every tool is not enforced on this kernel: %s", cfg.Path, m))
	}
	failures := r.Failures()
	for _, key := range slices.Sorted(maps.Keys(failures)) {
		out = append(out, fmt.Sprintf("%s: %s: the source is down: %v", cfg.Path, key, failures[key]))
	}
	snap := r.Snapshot()
	for _, d := range snap.Tools {
		if g := d.Guarantees; g != nil && len(g.Keys) == 0 && !g.Pure {
			out = append(out, fmt.Sprintf("%s: %s: declares nothing it cannot do, so it runs with the baseline alone: declare %s",
				cfg.Path, d.ID, declareWhere(d)))
		}
		if d.Quarantined != "" {
			out = append(out, fmt.Sprintf("%s: policy.require_lock: %s is quarantined: %s", cfg.Path, d.ID, d.Quarantined))
		}
		// A pin that does not vouch for all capgate pins now (its launch,
		// the files its run names) still lets the tool run.
		if note := snap.OutdatedPin(d.ID); note != "" {
			out = append(out, fmt.Sprintf("%s: capgate.lock: %s runs under an outdated pin: %s", cfg.Path, d.ID, note))
		}
		if g := d.Guarantees; g != nil && !g.Enforced && !(g.AllowUnsafe && allowUnsafe) {
			var miss []string
			for _, k := range g.Keys {
				if !k.Enforced {
					miss = append(miss, k.Key+" needs "+k.Missing)
				}
			}
			if len(miss) == 0 { // only the deny paths, capgate's own files
				miss = append(miss, "keeping capgate's files from it needs Landlock")
			}
			out = append(out, fmt.Sprintf("%s: %s: guarantees not enforceable on this kernel: %s", cfg.Path, d.ID, strings.Join(miss, "; ")))
		}
	}
	return out
}
