package skills

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/capgate/capgate/internal/suggest"
)

// SourceConfig is the Source of the problems Apply reports.
const SourceConfig = "config"

// Settings are an operator's word on one skill: the config's
// [skills.NAME] table.
type Settings struct {
	Enabled      *bool // nil: enabled
	Model        string
	AllowChatIDs []string // nil: the defaults'
	Env          map[string]string
}

// Apply applies the config's [skills.NAME] tables to the skills in effect
// and returns the enabled ones, sorted by name, as copies with the
// config's values on them (set itself is not changed):
//
//   - a skill is enabled unless its table says enabled = false;
//   - model, when set, replaces the skill's Model;
//   - AllowChatIDs is the table's allow_chat_ids when it has that key (even
//     an empty list), else [skills.defaults] allow_chat_ids;
//   - EnvValues is the table's env. Every name in the skill's env must have
//     a non-empty value there, and every key must be UPPER_CASE; otherwise
//     the skill is reported and not enabled.
//
// [skills.defaults] is not a skill. A table for a skill that is not in set
// is reported. Problems have Source "config" and name the key.
func Apply(set *Set, cfg map[string]Settings) (enabled []*Skill, problems []Problem) {
	fail := func(name, format string, args ...any) {
		problems = append(problems, Problem{Source: SourceConfig, Name: name, Err: fmt.Errorf(format, args...)})
	}
	defaults := cfg[DefaultsName]
	for _, name := range slices.Sorted(maps.Keys(cfg)) {
		if name == DefaultsName || set.Get(name) != nil {
			continue
		}
		known := "there are no skills"
		if len(set.Skills) > 0 {
			known = "the skills are " + strings.Join(set.Names(), ", ")
		}
		if hint := suggest.Nearest(name, set.Names()); hint != "" {
			known = fmt.Sprintf("did you mean %q? %s", hint, known)
		}
		fail(name, "[skills.%s] in the config: there is no skill %q (%s)", name, name, known)
	}
	for _, s := range set.Skills {
		if Disabled(cfg, s.Name) {
			continue
		}
		c := cfg[s.Name]
		bad := false
		for _, k := range slices.Sorted(maps.Keys(c.Env)) {
			if !envRE.MatchString(k) {
				fail(s.Name, "[skills.%s] env: %q is not an UPPER_CASE environment variable name", s.Name, k)
				bad = true
			}
		}
		for _, v := range s.Env {
			val, ok := c.Env[v]
			switch {
			case !ok:
				fail(s.Name, "skill %s needs the environment variable %s: set it in the config, [skills.%s] env = { %s = \"...\" }; the skill is not enabled",
					s.Name, v, s.Name, v)
				bad = true
			case val == "":
				fail(s.Name, "skill %s needs the environment variable %s, but [skills.%s] env gives it an empty value; the skill is not enabled",
					s.Name, v, s.Name)
				bad = true
			}
		}
		if bad {
			continue
		}
		e := *s
		if c.Model != "" {
			e.Model = c.Model
		}
		e.AllowChatIDs = slices.Clone(defaults.AllowChatIDs)
		if c.AllowChatIDs != nil {
			e.AllowChatIDs = slices.Clone(c.AllowChatIDs)
		}
		e.EnvValues = maps.Clone(c.Env)
		enabled = append(enabled, &e)
	}
	return enabled, problems
}

// Disabled reports whether the config turns the skill off (enabled = false).
func Disabled(cfg map[string]Settings, name string) bool {
	c, ok := cfg[name]
	return ok && c.Enabled != nil && !*c.Enabled
}
