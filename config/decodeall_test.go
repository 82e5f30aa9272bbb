package config

import (
	"strings"
	"testing"
)

// KeyLine finds a key as config's messages name it: dotted, quoted where
// a part holds a dot, a list's element by index, a key of an inline
// table, or its table's header.
func TestKeyLine(t *testing.T) {
	src := []byte(`[policy]
grants = [
  "a",
  "b",
]
rate_limit = { per_minute = 5 }

[policy.side_effects]
"fs.delete" = "deny"

[mcp.servers.fs]
command = "npx"
`)
	for key, want := range map[string]int{
		"policy.grants":                   2,
		"policy.grants[1]":                4,
		"policy.rate_limit.per_minute":    6,
		`policy.side_effects."fs.delete"`: 9,
		"mcp.servers.fs.command":          12,
		"mcp.servers.fs.args":             11, // not written: its table
		"server.listen":                   0,
	} {
		if got := KeyLine(src, key); got != want {
			t.Errorf("KeyLine(%s) = %d, want %d", key, got, want)
		}
	}
}

// Parse reports every value of the wrong type and every unknown key in
// one error, and still checks the values that decoded.
func TestParseReportsEveryProblem(t *testing.T) {
	_, err := parse(t, "[server]\nlisten = 5\nlistne = \"x\"\n[audit]\nmax_size = \"lots\"\n[policy]\ngrants = [\"a b\"]\n", nil)
	for _, want := range []string{
		"capgate.toml:2: server.listen: is a TOML integer; want a string",
		"capgate.toml:3: server.listne: unknown key (did you mean listen?)",
		`capgate.toml:5: audit.max_size: "lots" is not a size`,
		`capgate.toml: policy.grants[0]: grant "a b" contains white space`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant %s", err, want)
		}
	}
}
