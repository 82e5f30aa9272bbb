package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/capgate/capgate/sandbox"
)

// validateGuarantees checks every capabilities table, override and the
// trust ceiling with the sandbox package's own parsers, so an error names
// the key as the file spells it.
func (c *Config) validateGuarantees(fail func(key, format string, args ...any)) {
	check := func(err error) {
		if err != nil {
			// sandbox's errors start with the key they were given.
			key, msg, _ := strings.Cut(err.Error(), ": ")
			fail(key, "%s", msg)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.MCP.Servers)) {
		s := c.MCP.Servers[name]
		if s == nil || s.Capabilities == nil {
			continue
		}
		key := "mcp.servers." + name + ".capabilities"
		if s.URL != "" {
			fail(key, "a server reached by url is not a process capgate starts; only a command's can be confined")
			continue
		}
		_, err := sandbox.ParseDeclared(s.Capabilities, key)
		check(err)
	}
	for _, p := range c.Providers() {
		if p.Capabilities != nil {
			_, err := sandbox.ParseDeclared(p.Capabilities, p.Key+".capabilities")
			check(err)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.CapabilityOverrides)) {
		_, err := sandbox.ParseOverrides(c.CapabilityOverrides[id], "capability_overrides."+quoteKey(id))
		check(err)
	}
	if c.Sandbox.RunAs != "" {
		if _, err := sandbox.ParseUser(c.Sandbox.RunAs); err != nil {
			fail("sandbox.run_as", "%v", err)
		}
	}
	if c.Trust.AllowedCapabilities != nil {
		_, err := sandbox.ParseDeclared(c.Trust.AllowedCapabilities, "trust.allowed_capabilities")
		check(err)
	}
}

// quoteKey writes a table key as TOML needs it: a tool id has colons.
func quoteKey(k string) string { return `"` + k + `"` }
