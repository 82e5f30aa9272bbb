package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/skills"
)

func newSkillCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "skill",
		Short: "List and validate skills (SKILL.md files)",
		Long: `A skill is a SKILL.md (in skills/<name>/) or a <name>.md: YAML frontmatter
between "---" lines (description is required), then markdown instructions.
Skills are found in these sources, a later one overriding an earlier one of
the same name: installed (--skills-dir), user (~/.capgate/skills) and
workspace (<workspace>/skills).`,
	}
	cmd.AddCommand(newSkillListCmd(), newSkillValidateCmd())
	return cmd
}

type skillListOptions struct {
	configPath string
	workspace  string
	dirs       []string
	json       bool
}

func newSkillListCmd() *cobra.Command {
	var o skillListOptions
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the skills in effect, with their source and state",
		Long: `list finds the skills of every source, applies the config's [skills.NAME]
tables and prints each skill in effect with its source and state: enabled,
disabled (enabled = false in the config) or unavailable (the config lacks
something it needs, such as an env value). Files that could not be used and
config tables that do not fit are printed on stderr.

The config is --config, or ./capgate.toml when it exists. The workspace is
--workspace, else the config's directory, else the current directory.

Exit status: 0 with no problems, 1 with problems, 2 on a bad config.`,
		Example: `  capgate skill list
  capgate skill list --workspace ~/project --skills-dir /opt/skills --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSkillList(cmd, o)
		},
	}
	cmd.Flags().StringVar(&o.configPath, "config", "capgate.toml", "the capgate.toml to read")
	cmd.Flags().StringVar(&o.workspace, "workspace", "", "the workspace directory, whose skills are in <workspace>/skills (default: the config's directory)")
	cmd.Flags().StringArrayVar(&o.dirs, "skills-dir", nil, "a directory of installed skills (repeatable; a later one overrides an earlier one)")
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

type skillListEntry struct {
	Name        string   `json:"name"`
	Source      string   `json:"source"`
	State       string   `json:"state"`
	Description string   `json:"description"`
	Path        string   `json:"path"`
	Overrides   []string `json:"overrides,omitempty"`
	Model       string   `json:"model,omitempty"`
	Grants      []string `json:"grants,omitempty"`
	ToolNames   []string `json:"tool_names,omitempty"`
}

type skillProblem struct {
	Source string `json:"source"`
	Path   string `json:"path,omitempty"`
	Name   string `json:"name,omitempty"`
	Line   int    `json:"line,omitempty"`
	Error  string `json:"error"`
	// InEffect is the file of the skill of that name in effect instead.
	InEffect string `json:"in_effect,omitempty"`
}

func runSkillList(cmd *cobra.Command, o skillListOptions) error {
	var cfg *config.Config
	if _, err := os.Stat(o.configPath); cmd.Flags().Changed("config") || err == nil {
		c, err := config.Load(o.configPath)
		if err != nil {
			return usageError("%v", err)
		}
		cfg = c
	}
	workspace := o.workspace
	if workspace == "" {
		workspace = "."
		if cfg != nil {
			workspace = cfg.Dir
		}
	}
	if cfg != nil {
		// [skills] dirs first: a --skills-dir, later, overrides them.
		o.dirs = append(slices.Clone(cfg.SkillDirs), o.dirs...)
	}
	set, err := skills.Discover(skills.Options{Installed: o.dirs, Workspace: workspace})
	if err != nil {
		return usageError("%v", err)
	}
	var skillCfg map[string]skills.Settings
	if cfg != nil {
		skillCfg = app.SkillSettings(cfg.Skills)
	}
	enabled, cfgProblems := skills.Apply(set, skillCfg)

	entries := []skillListEntry{}
	for _, s := range set.Skills {
		e := skillListEntry{Name: s.Name, Source: s.Source, State: "unavailable", Description: s.Description,
			Path: s.Path, Overrides: s.Overrides, Model: s.Model, Grants: s.Grants(), ToolNames: s.ToolNames()}
		if skills.Disabled(skillCfg, s.Name) {
			e.State = "disabled"
		}
		for _, en := range enabled {
			if en.Name == s.Name {
				e.State, e.Model = "enabled", en.Model
			}
		}
		entries = append(entries, e)
	}
	problems := []skillProblem{}
	for _, p := range append(set.Problems, cfgProblems...) {
		sp := skillProblem{Source: p.Source, Path: p.Path, Name: p.Name, Line: p.Line, Error: p.Error()}
		if s := set.Get(p.Name); s != nil && p.Source != skills.SourceConfig && s.Path != p.Path {
			sp.InEffect = s.Path
		}
		problems = append(problems, sp)
	}

	out := cmd.OutOrStdout()
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Skills   []skillListEntry `json:"skills"`
			Problems []skillProblem   `json:"problems"`
		}{entries, problems}); err != nil {
			return err
		}
	} else {
		printSkills(out, entries)
		if len(entries) == 0 {
			looked := append(append([]string{}, o.dirs...), "~/.capgate/skills", filepath.Join(workspace, "skills"))
			fmt.Fprintf(out, "no skills (looked in %s)\n", strings.Join(looked, ", "))
		}
		errw := cmd.ErrOrStderr()
		for _, p := range problems {
			msg := p.Error
			if p.InEffect != "" {
				msg += fmt.Sprintf(" (%s stays in effect)", p.InEffect)
			}
			fmt.Fprintf(errw, "%s [%s]\n", msg, p.Source)
		}
	}
	if len(problems) > 0 {
		return &exitError{code: exitDenied}
	}
	return nil
}

func printSkills(out io.Writer, entries []skillListEntry) {
	if len(entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tSTATE\tDESCRIPTION")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Name, e.Source, e.State, skillOneLine(e.Description, 80))
	}
	tw.Flush()
}

// skillOneLine is the first line of s, cut to at most n runes.
func skillOneLine(s string, n int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func newSkillValidateCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "validate PATH...",
		Short: "Check skill files, or every skill in a directory",
		Long: `validate checks each PATH: a skill file (SKILL.md or <name>.md), a skill's
directory (holding SKILL.md), or a skills directory (every <name>/SKILL.md
and <name>.md in it). It prints "ok  PATH  NAME: DESCRIPTION" for each good
skill and the errors, with file and line, for each bad one.

Exit status: 0 when every skill is valid, 1 when one is not, 2 when a PATH
cannot be read.`,
		Example: `  capgate skill validate skills/email/SKILL.md
  capgate skill validate skills/`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code := exitOK
			res := skillValidateResult{Skills: []skillValidated{}, Problems: []string{}}
			for _, path := range args {
				found, problems, c := validateSkillPath(path)
				code = max(code, c)
				for _, s := range found {
					res.Skills = append(res.Skills, skillValidated{Path: s.Path, Name: s.Name, Description: s.Description})
					if !asJSON {
						fmt.Fprintf(cmd.OutOrStdout(), "ok  %s  %s: %s\n", s.Path, s.Name, skillOneLine(s.Description, 80))
					}
				}
				res.Problems = append(res.Problems, problems...)
				if !asJSON {
					for _, p := range problems {
						fmt.Fprintln(cmd.ErrOrStderr(), p)
					}
				}
			}
			if asJSON {
				res.OK = code == exitOK
				if err := json.NewEncoder(cmd.OutOrStdout()).Encode(res); err != nil {
					return err
				}
			}
			if code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print one JSON object on stdout: {"ok","skills":[{"path","name","description"}],"problems"}`)
	return cmd
}

// skillValidateResult is what `skill validate --json` prints; the exit
// status is the text form's.
type skillValidateResult struct {
	OK       bool             `json:"ok"`
	Skills   []skillValidated `json:"skills"`
	Problems []string         `json:"problems"` // as the text form prints them
}

type skillValidated struct {
	Path        string `json:"path"`
	Name        string `json:"name"`
	Description string `json:"description"`
}

// validateSkillPath validates one PATH argument: the good skills, each
// problem as a line, and its exit code.
func validateSkillPath(path string) ([]*skills.Skill, []string, int) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, []string{"capgate: " + err.Error()}, exitUsage
	}
	if !fi.IsDir() {
		s, err := skills.ReadFile(path)
		if err != nil {
			return nil, []string{err.Error()}, exitDenied
		}
		return []*skills.Skill{s}, nil, exitOK
	}
	if file := filepath.Join(path, "SKILL.md"); skillFileExists(file) {
		return validateSkillPath(file)
	}
	found, problems := skills.LoadDir(path, "")
	var out []string
	for _, p := range problems {
		out = append(out, p.Error())
	}
	switch {
	case len(problems) > 0:
		return found, out, exitDenied
	case len(found) == 0:
		return nil, []string{fmt.Sprintf("%s: no skills here: a skill is <name>/SKILL.md or <name>.md", path)}, exitDenied
	}
	return found, nil, exitOK
}

func skillFileExists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
