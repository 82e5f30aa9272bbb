package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
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
	var asJSON bool
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
			if asJSON {
				return runConfigCheckJSON(cmd.OutOrStdout(), path)
			}
			return runConfigCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), path)
		},
	}
	check.Flags().StringVar(&path, "config", "", "the config file to check (required)")
	check.Flags().BoolVar(&asJSON, "json", false, `print one JSON object on stdout: {"file","ok","notes","problems"}, problems as the text prints them`)
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

// configCheckResult is what `config check --json` prints; the exit
// status is the text form's (0 usable, 2 not).
type configCheckResult struct {
	File     string   `json:"file"`
	OK       bool     `json:"ok"`
	Notes    []string `json:"notes"`    // what loading decided that the file does not say
	Problems []string `json:"problems"` // "file:line: key: problem", as the text form prints them
}

func runConfigCheckJSON(out io.Writer, path string) error {
	res := configCheckResult{File: path, Notes: []string{}, Problems: []string{}}
	if path == "" {
		res.Problems = append(res.Problems, "--config is required")
	} else {
		cfg, src, problems := checkConfig(path)
		if len(problems) == 0 {
			res.OK = true
			res.Notes = append(res.Notes, withLines(src, prefixed(cfg.Path, cfg.Notes))...)
		}
		for _, p := range problems {
			res.Problems = append(res.Problems, fmt.Sprint(p))
		}
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	if !res.OK {
		return &exitError{code: exitUsage}
	}
	return nil
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
		return nil, src, byLine(withLines(src, lines(err)))
	}
	return cfg, src, byLine(semanticProblems(cfg, src))
}

// lineRE is the line a "file:line: ..." problem names.
var lineRE = regexp.MustCompile(`^[^:]+:(\d+): `)

// byLine orders problems by the line they name, in the order the file
// reads; those without a line keep their order, after the rest.
func byLine(problems []string) []string {
	line := func(p string) int {
		if m := lineRE.FindStringSubmatch(p); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
		return math.MaxInt
	}
	slices.SortStableFunc(problems, func(a, b string) int { return line(a) - line(b) })
	return problems
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
		if n := config.KeyLine(src, m[2]); n > 0 {
			problems[i] = fmt.Sprintf("%s:%d: %s: %s", m[1], n, m[2], m[3])
		}
	}
	return problems
}

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
