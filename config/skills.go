package config

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// skillEnvKey is an Ash env value written straight into [skills.NAME]
// (API_KEY = "..."): UPPER_CASE keys there are the skill's environment.
var skillEnvKey = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// skillEnvKeys takes the UPPER_CASE keys of [skills.NAME] tables out of the
// strict decoder's unknown keys and merges them into the skills' Env, as Ash
// reads them. Every other unknown key stays an error. It returns the errors
// left: unknown keys, non-string values, a key also in env = {...}.
func (c *Config) skillEnvKeys(name string, data []byte, decodeErr error) error {
	var strict *toml.StrictMissingError
	if !errors.As(decodeErr, &strict) {
		return decodeError(name, decodeErr)
	}
	var raw struct {
		Skills map[string]map[string]any `toml:"skills"`
	}
	// The strict decode already parsed this document, so a loose one
	// cannot fail where it did not.
	if err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw); err != nil {
		return decodeError(name, err)
	}
	// Where each env key is: go-toml names a key of an inline skill table
	// (skills.x = { KEY = "v" }) without the skill, so match on the key.
	rows := map[string]int{}
	var errs []error
	for _, e := range strict.Errors {
		key := e.Key()
		row, _ := e.Position()
		switch {
		case len(key) >= 3 && key[0] == "skills" && raw.Skills[key[1]][key[2]] != nil && skillEnvKey.MatchString(key[2]):
			if _, ok := rows[key[1]+"."+key[2]]; !ok {
				rows[key[1]+"."+key[2]] = row
			}
		case len(key) == 2 && key[0] == "skills" && skillEnvKey.MatchString(key[1]):
			for _, skill := range slices.Sorted(maps.Keys(raw.Skills)) {
				if _, ok := rows[skill+"."+key[1]]; !ok && raw.Skills[skill][key[1]] != nil {
					rows[skill+"."+key[1]] = row
				}
			}
		default:
			errs = append(errs, unknownKey(name, row, key))
		}
	}
	for _, skill := range slices.Sorted(maps.Keys(raw.Skills)) {
		for _, env := range slices.Sorted(maps.Keys(raw.Skills[skill])) {
			row, ok := rows[skill+"."+env]
			if !ok {
				continue // a known key, or not UPPER_CASE
			}
			where := fmt.Sprintf("%s:%d: skills.%s.%s", name, row, skill, env)
			// The value is never quoted back: it may be a credential.
			v, ok := raw.Skills[skill][env].(string)
			if !ok {
				errs = append(errs, fmt.Errorf("%s: is a TOML %s; want a string (an UPPER_CASE key in [skills.%s] is an environment value)",
					where, tomlKind(raw.Skills[skill][env]), skill))
				continue
			}
			s := c.Skills[skill]
			if _, dup := s.Env[env]; dup {
				errs = append(errs, fmt.Errorf("%s: also set in skills.%s.env; give it in one place", where, skill))
				continue
			}
			if s.Env == nil {
				s.Env = map[string]string{}
			}
			s.Env[env] = v
			c.Skills[skill] = s
		}
	}
	return errors.Join(errs...)
}

// tomlKind names a decoded TOML value's type for messages.
func tomlKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "table"
	case []any:
		return "array"
	case bool:
		return "boolean"
	case int64:
		return "integer"
	case float64:
		return "float"
	case nil:
		return "nothing"
	}
	return "date or time"
}

// ashProviders are the provider wirings Ash applies when a bundled skill
// is enabled with no command of its own: [skills.gog] enabled = true runs
// `gogcli bridge` under the namespace gog.
var ashProviders = map[string]Provider{
	"gog": {Namespace: "gog", Command: []string{"gogcli", "bridge"}},
}

// applyAshProviders gives an enabled bundled skill Ash's default provider
// wiring: what its capability_provider table leaves out comes from the
// default, and [capabilities.providers.NAME] still overrides it (see
// mergeSkillProviders). Each default applied is a note for config check.
func (c *Config) applyAshProviders() {
	for _, name := range slices.Sorted(maps.Keys(ashProviders)) {
		s, ok := c.Skills[name]
		if !ok || s.Enabled == nil || !*s.Enabled {
			continue // Ash wires a bundled skill only when it is enabled
		}
		def := ashProviders[name]
		p := s.CapabilityProvider
		if p == nil {
			p = &Provider{}
		}
		var applied []string
		if len(p.Command) == 0 {
			if over := c.Capabilities.Providers[name]; over == nil || len(over.Command) == 0 {
				p.Command = slices.Clone(def.Command)
				applied = append(applied, fmt.Sprintf("command = [%q, %q]", def.Command[0], def.Command[1]))
			}
		}
		if p.Namespace == "" {
			if over := c.Capabilities.Providers[name]; over == nil || over.Namespace == "" {
				p.Namespace = def.Namespace
				applied = append(applied, fmt.Sprintf("namespace = %q", def.Namespace))
			}
		}
		s.CapabilityProvider = p
		c.Skills[name] = s
		if len(applied) > 0 {
			c.Notes = append(c.Notes, fmt.Sprintf("skills.%s: enabled = true applies Ash's default provider wiring: %s",
				name, strings.Join(applied, ", ")))
		}
	}
}

// mergeSkillProviders applies Ash's rules for [skills.X.capability_provider]:
// an explicit [capabilities.providers.X] overrides it field by field (the
// operator's word wins; what it leaves out, command above all, comes from
// the skill's table), and the result is one provider, listed under
// capabilities.providers.X. A disabled skill's table is left out: the skill
// is off, so is what it would wire (Providers skips it).
func (c *Config) mergeSkillProviders() {
	for _, name := range slices.Sorted(maps.Keys(c.Skills)) {
		s := c.Skills[name]
		over := c.Capabilities.Providers[name]
		if s.CapabilityProvider == nil || over == nil || skillDisabled(s) {
			continue
		}
		m := *s.CapabilityProvider
		if over.Enabled != nil {
			m.Enabled = over.Enabled
		}
		if over.Namespace != "" {
			m.Namespace = over.Namespace
		}
		if len(over.Command) > 0 {
			m.Command = over.Command
		}
		if over.TimeoutSeconds != 0 {
			m.TimeoutSeconds = over.TimeoutSeconds
		}
		if over.Env != nil {
			m.Env = over.Env
		}
		if over.Capabilities != nil {
			m.Capabilities = over.Capabilities
		}
		if m.Namespace == "" {
			m.Namespace = name
		}
		c.Capabilities.Providers[name] = &m
		s.CapabilityProvider = nil
		c.Skills[name] = s
	}
}

func skillDisabled(s Skill) bool { return s.Enabled != nil && !*s.Enabled }
