package tool

import (
	"maps"
	"slices"
)

// Runners say where a tool runs, in the trace's words: local is a process
// capgate starts (and confines), service one it only talks to.
const (
	RunnerLocal   = "local"
	RunnerService = "service"
)

// The trace's resolved_source words (namel3ss): where a tool was resolved
// from. An extension pack in [extensions] paths is an installed pack; an
// upstream MCP server or a bridge provider is a binding the operator
// configured. capgate ships no pack of its own, so builtin_pack is not
// used.
const (
	SourceBuiltinPack   = "builtin_pack"
	SourceInstalledPack = "installed_pack"
	SourceBinding       = "binding"
)

// ResolvedSource is the trace's resolved_source word for a tool of kind k.
func ResolvedSource(k Kind) string {
	if k == KindExt {
		return SourceInstalledPack
	}
	return SourceBinding
}

// Guarantees are a tool's effective negative guarantees as capgate shows
// them (tools show, tools/list _meta "capgate/guarantees", the audit): what
// the tool cannot do, where each guarantee came from, and whether this
// kernel enforces it. A guarantee not listed is not guaranteed.
type Guarantees struct {
	Runner         string      `json:"runner"`
	Keys           []Guarantee `json:"keys"`
	SecretsAllowed []string    `json:"secrets_allowed"`
	SecretsSource  string      `json:"secrets_source,omitempty"`
	// Enforced: every key is proven by this kernel, so the tool runs.
	Enforced bool `json:"enforced"`
	// AllowUnsafe: the operator lets it run without that proof.
	AllowUnsafe bool `json:"allow_unsafe_execution,omitempty"`
	// Pure: the tool declared purity: pure, which set the keys it lists
	// as from "tool".
	Pure bool `json:"pure,omitempty"`
	// Flat is namel3ss's flat form of the same guarantees: every boolean
	// guarantee by key ("no_network": true), true only where the tool has
	// it and this kernel enforces it, so a tool run without that proof
	// (allow_unsafe_execution) reads false.
	Flat map[string]bool `json:"flat"`
	// ReadPaths and WritePaths are the declared paths the tool may read
	// and write beyond its own (read_paths, write_paths), as in effect.
	ReadPaths  []string `json:"read_paths,omitempty"`
	WritePaths []string `json:"write_paths,omitempty"`
}

// Guarantee is one guarantee: its key ("no_network"), the derivation step
// that set it (tool, user or policy: the trace's guarantee_source words),
// and the kernel feature it lacks here when not enforced.
type Guarantee struct {
	Key      string `json:"key"`
	Source   string `json:"source"`
	Enforced bool   `json:"enforced"`
	Missing  string `json:"missing,omitempty"`
}

// Get returns the guarantee named key, if the tool has it.
func (g *Guarantees) Get(key string) (Guarantee, bool) {
	if g == nil {
		return Guarantee{}, false
	}
	for _, k := range g.Keys {
		if k.Key == key {
			return k, true
		}
	}
	return Guarantee{}, false
}

// Clone returns a deep copy.
func (g *Guarantees) Clone() *Guarantees {
	if g == nil {
		return nil
	}
	c := *g
	c.Keys = slices.Clone(g.Keys)
	c.SecretsAllowed = slices.Clone(g.SecretsAllowed)
	c.Flat = maps.Clone(g.Flat)
	c.ReadPaths, c.WritePaths = slices.Clone(g.ReadPaths), slices.Clone(g.WritePaths)
	return &c
}
