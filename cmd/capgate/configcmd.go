package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/token"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with capgate.toml",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var path string
	check := &cobra.Command{
		Use:   "check --config FILE",
		Short: "Report everything capgate serve would refuse in a config, without starting anything",
		Long: `check reads the config as capgate serve does and reports every problem it can
find, one "file:line: key: problem" (or "file: key: problem" where the line is
not known) a line: unknown keys, wrong types, invalid values, an unreadable
risk file, grants the risk file cannot classify, an unusable JWKS. It starts
no source, opens no store and makes no key.

Exit status: 0 the config is usable ("FILE: OK" on stdout), 2 it is not.`,
		Example: `  capgate config check --config capgate.toml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConfigCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), path)
		},
	}
	check.Flags().StringVar(&path, "config", "", "the config file to check (required)")
	cmd.AddCommand(check)
	return cmd
}

func runConfigCheck(out, errOut io.Writer, path string) error {
	if path == "" {
		return usageError("--config is required")
	}
	cfg, src, problems := checkConfig(path)
	if len(problems) == 0 {
		// What loading decided that the file does not say, such as Ash's
		// default wiring of an enabled bundled skill.
		for _, n := range withLines(src, prefixed(cfg.Path, cfg.Notes)) {
			fmt.Fprintln(out, n)
		}
		_, err := fmt.Fprintf(out, "%s: OK\n", path)
		return err
	}
	for _, p := range problems {
		fmt.Fprintln(errOut, p)
	}
	return &exitError{code: exitUsage}
}

// prefixed puts "file: " before each line.
func prefixed(file string, ls []string) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = file + ": " + l
	}
	return out
}

// configProblems is every problem with the config at path that serve
// would refuse before it starts a source.
func configProblems(path string) []string {
	_, _, problems := checkConfig(path)
	return problems
}

// checkConfig loads the config at path and reports what configProblems
// does, so that a caller which goes on with the config reads and loads it
// once. cfg is nil when it does not load; src is the file as read.
func checkConfig(path string) (cfg *config.Config, src []byte, problems []string) {
	src, _ = os.ReadFile(path)
	cfg, err := config.Load(path)
	if err != nil {
		return nil, src, withLines(src, lines(err))
	}
	return cfg, src, semanticProblems(cfg, src)
}

// semanticProblems are the problems of a config that loaded: its grants
// as the risk file classifies them, and its JWKS file.
func semanticProblems(cfg *config.Config, src []byte) []string {
	var out []string
	add := func(err error) { out = append(out, lines(err)...) }
	table, err := app.RiskTable(cfg.Policy.RiskFile)
	if err != nil {
		add(fmt.Errorf("%s: policy.risk_file: %w", cfg.Path, err))
	}
	if table != nil {
		// The grants the router compiles at startup, as it compiles them.
		p := app.Policy(cfg)
		check := func(key string, grants, acks []string) {
			ev, err := table.Evaluate(grants, acks)
			if err == nil {
				_, err = ev.Set()
			}
			if err != nil {
				add(fmt.Errorf("%s: %s: %w", cfg.Path, key, err))
			}
		}
		check("policy.grants", p.Grants, p.Acknowledge)
		for _, sub := range slices.Sorted(maps.Keys(p.Subjects)) {
			check("policy.subjects."+sub, p.Subjects[sub].Grants, p.Subjects[sub].Acknowledge)
		}
		if p.Anonymous != nil {
			check("auth.anonymous", p.Anonymous.Grants, p.Anonymous.Acknowledge)
		}
	}
	if cfg.Auth.JWKSFile != "" {
		raw, err := os.ReadFile(cfg.Auth.JWKSFile)
		if err == nil {
			_, err = token.NewVerifier(token.Options{JWKS: raw})
		}
		if err != nil {
			add(fmt.Errorf("%s: auth.jwks_file: %w", cfg.Path, err))
		}
	}
	return withLines(src, out)
}

// problemRE is a problem without a line: "file: key: problem".
var problemRE = regexp.MustCompile(`^([^:]+): ([A-Za-z0-9_.\-\[\]"]+): (.*)$`)

// withLines adds the line of the key each problem names, where src has it:
// config's semantic errors name the key but not its line.
func withLines(src []byte, problems []string) []string {
	for i, p := range problems {
		m := problemRE.FindStringSubmatch(p)
		if m == nil {
			continue
		}
		if n := keyLine(src, m[2]); n > 0 {
			problems[i] = fmt.Sprintf("%s:%d: %s: %s", m[1], n, m[2], m[3])
		}
	}
	return problems
}

// keyLine is the 1-based line of src where the dotted key (indices like
// [2] ignored) is set, or its table's header; 0 when neither is found.
func keyLine(src []byte, key string) int {
	key = indexRE.ReplaceAllString(key, "")
	table, header := "", 0
	for i, l := range strings.Split(string(src), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "["):
			table = unquote(strings.Trim(strings.SplitN(l, "#", 2)[0], "[] \t"))
			if table == key && header == 0 {
				header = i + 1
			}
		case strings.Contains(l, "=") && !strings.HasPrefix(l, "#"):
			k := unquote(strings.TrimSpace(strings.SplitN(l, "=", 2)[0]))
			if table != "" {
				k = table + "." + k
			}
			if k == key {
				return i + 1
			}
		}
	}
	return header
}

var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

// unquote drops the quotes of quoted key parts: a."b.c" reads as a.b.c,
// which is how config names such a key too.
func unquote(k string) string { return unquoter.Replace(k) }

var unquoter = strings.NewReplacer(`"`, "", "'", "", " ", "")

// lines splits a (joined) error into its lines.
func lines(err error) []string {
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}
