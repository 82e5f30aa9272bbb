// Package sandbox holds capgate's negative guarantees: what a tool cannot
// do (the model and its derivation), what this kernel can prove (the probe),
// and the launcher every subprocess starts through, which has the kernel
// enforce them with Landlock, seccomp and namespaces.
package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Key names one guarantee, as written in config, audit records and _meta.
type Key string

// The guarantees. Absence (false) means "not guaranteed", never "allowed".
const (
	NoFilesystemWrite Key = "no_filesystem_write"
	NoFilesystemRead  Key = "no_filesystem_read"
	NoNetwork         Key = "no_network"
	NoSubprocess      Key = "no_subprocess"
	NoEnvRead         Key = "no_env_read"
	NoEnvWrite        Key = "no_env_write"
	SecretsAllowed    Key = "secrets_allowed"
)

// Capability is the trace's word for what k withholds (no_network:
// network). The launcher's deny paths, capgate's own files, are reads.
func (k Key) Capability() string {
	switch k {
	case NoFilesystemWrite:
		return "filesystem_write"
	case NoFilesystemRead, "deny":
		return "filesystem_read"
	case NoNetwork:
		return "network"
	case NoSubprocess:
		return "subprocess"
	case NoEnvRead:
		return "env_read"
	case NoEnvWrite:
		return "env_write"
	}
	return string(k)
}

// Keys lists the boolean guarantees in a fixed order.
var Keys = []Key{NoFilesystemWrite, NoFilesystemRead, NoNetwork, NoSubprocess, NoEnvRead, NoEnvWrite}

// Source says which step of the derivation set a guarantee. The values are
// the trace's guarantee_source words.
type Source string

const (
	FromDeclaration Source = "tool"   // the source's declaration (or purity: pure)
	FromPack        Source = "pack"   // an extension pack's declaration for all its commands
	FromOverride    Source = "user"   // the operator's [capability_overrides]
	FromTrust       Source = "policy" // the [trust] ceiling
)

// Guarantees are a tool's effective negative guarantees. Set holds the keys
// that are guaranteed; From says where each came from. SecretsAllowed is the
// only secrets the tool may receive (nil: none); SecretsFrom is where that
// list was last narrowed.
type Guarantees struct {
	Set            map[Key]bool
	From           map[Key]Source
	SecretsAllowed []string
	SecretsFrom    Source
	Pure           bool // declared purity: pure, which set every key
	// ReadPaths and WritePaths are the declared paths beyond the tool's
	// own (read_paths under filesystem read, write_paths under write);
	// a guarantee that forbids them (no_filesystem_read, no_filesystem_write)
	// wins.
	ReadPaths, WritePaths []string
}

// confined reports whether g guarantees anything beyond the baseline.
func confined(g Guarantees) bool {
	// write_paths is a limit too: no writes outside them.
	if len(g.WritePaths) > 0 {
		return true
	}
	for _, v := range g.Set {
		if v {
			return true
		}
	}
	return false
}

// Has reports whether k is guaranteed.
func (g Guarantees) Has(k Key) bool { return g.Set[k] }

func (g *Guarantees) tighten(k Key, from Source) {
	if g.Set == nil {
		g.Set, g.From = map[Key]bool{}, map[Key]Source{}
	}
	if !g.Set[k] {
		g.Set[k], g.From[k] = true, from
	}
}

// Declared is what a source declares for a tool (extension.yaml's
// capabilities:) or for a whole process (capgate.toml's capabilities = {}).
// An empty field is undeclared, which guarantees nothing.
type Declared struct {
	Filesystem string   // none | read | write
	Network    string   // none | outbound
	Env        string   // none | read
	Subprocess string   // none | allow
	Secrets    []string // names of the secrets the tool needs
	Pure       bool     // purity: pure guarantees everything
	// Pack is the declaration of the tool's whole pack (extension.yaml's
	// top-level capabilities), which holds for each of its commands on top
	// of the command's own: it only adds guarantees, each from "pack".
	Pack *Declared
	// ReadPaths (filesystem read) and WritePaths (filesystem write) are
	// absolute paths the tool may use beyond its own dir and work dir.
	ReadPaths, WritePaths []string
}

var declaredValues = map[string][]string{
	"filesystem": {"none", "read", "write"},
	"network":    {"none", "outbound"},
	"env":        {"none", "read"},
	"subprocess": {"none", "allow"},
}

// ParseDeclared reads a capabilities table as decoded from YAML or TOML.
// where names it in errors ("extension.yaml: commands.get.capabilities").
func ParseDeclared(m map[string]any, where string) (Declared, error) {
	var d Declared
	for k, v := range m {
		switch k {
		case "filesystem", "network", "env", "subprocess":
			s, ok := v.(string)
			if !ok {
				return Declared{}, fmt.Errorf("%s.%s: want a string (one of %s), got %T", where, k, strings.Join(declaredValues[k], "|"), v)
			}
			switch k {
			case "filesystem":
				d.Filesystem = s
			case "network":
				d.Network = s
			case "env":
				d.Env = s
			case "subprocess":
				d.Subprocess = s
			}
		case "read_paths", "write_paths":
			paths, err := pathList(v, where+"."+k)
			if err != nil {
				return Declared{}, err
			}
			if k == "read_paths" {
				d.ReadPaths = paths
			} else {
				d.WritePaths = paths
			}
		case "secrets":
			list, ok := v.([]any)
			if !ok {
				if ss, ok2 := v.([]string); ok2 {
					d.Secrets = slices.Clone(ss)
					continue
				}
				return Declared{}, fmt.Errorf("%s.secrets: want a list of names, got %T", where, v)
			}
			for i, e := range list {
				s, ok := e.(string)
				if !ok {
					return Declared{}, fmt.Errorf("%s.secrets[%d]: want a name, got %T", where, i, e)
				}
				d.Secrets = append(d.Secrets, s)
			}
		default:
			return Declared{}, fmt.Errorf("%s: unknown key %q (want filesystem, network, env, subprocess, secrets, read_paths, write_paths)", where, k)
		}
	}
	return d, d.Validate(where)
}

// Validate checks every declared value; where names it in errors.
func (d Declared) Validate(where string) error {
	for _, f := range []struct{ key, val string }{
		{"filesystem", d.Filesystem}, {"network", d.Network}, {"env", d.Env}, {"subprocess", d.Subprocess},
	} {
		if f.val != "" && !slices.Contains(declaredValues[f.key], f.val) {
			return fmt.Errorf("%s.%s: %q is not one of %s", where, f.key, f.val, strings.Join(declaredValues[f.key], "|"))
		}
	}
	for i, s := range d.Secrets {
		if !validEnvName(s) {
			return fmt.Errorf("%s.secrets[%d]: %q is not a variable name", where, i, s)
		}
	}
	// A path list widens what a filesystem declaration narrows; without
	// that declaration it would read as a limit that nothing enforces.
	if len(d.ReadPaths) > 0 && d.Filesystem != "read" && d.Filesystem != "write" {
		return fmt.Errorf("%s.read_paths: needs filesystem: read (it lists what a tool that reads only its own files may read too); filesystem is %s", where, orUndeclared(d.Filesystem))
	}
	if len(d.WritePaths) > 0 && d.Filesystem != "write" {
		return fmt.Errorf("%s.write_paths: needs filesystem: write (it lists where such a tool may write); filesystem is %s", where, orUndeclared(d.Filesystem))
	}
	return nil
}

func orUndeclared(s string) string {
	if s == "" {
		return "undeclared"
	}
	return s
}

// pathList reads a list of absolute paths.
func pathList(v any, where string) ([]string, error) {
	var list []any
	switch v := v.(type) {
	case []any:
		list = v
	case []string:
		for _, s := range v {
			list = append(list, s)
		}
	default:
		return nil, fmt.Errorf("%s: want a list of absolute paths, got %T", where, v)
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		if !ok || !filepath.IsAbs(s) {
			return nil, fmt.Errorf("%s[%d]: want an absolute path, got %v", where, i, e)
		}
		out = append(out, filepath.Clean(s))
	}
	return out, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r != '_' && (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// keys maps a declaration (or a trust ceiling, which has the same shape)
// to the guarantees it makes.
func (d Declared) keys() []Key {
	if d.Pure {
		return Keys
	}
	var ks []Key
	switch d.Filesystem {
	case "none":
		ks = append(ks, NoFilesystemRead, NoFilesystemWrite)
	case "read":
		ks = append(ks, NoFilesystemWrite)
	}
	if d.Network == "none" {
		ks = append(ks, NoNetwork)
	}
	if d.Subprocess == "none" {
		ks = append(ks, NoSubprocess)
	}
	switch d.Env {
	case "none":
		ks = append(ks, NoEnvRead, NoEnvWrite)
	case "read":
		// There is no "write": a declared env can never be written back.
		ks = append(ks, NoEnvWrite)
	}
	return ks
}

// Overrides are the operator's [capability_overrides."<tool id>"] keys. A
// nil field is unset. They only tighten.
type Overrides struct {
	Set            map[Key]bool // no_network = true, ...; false never loosens
	SecretsAllowed []string     // narrows the declared secrets; nil: unset
	SecretsSet     bool         // secrets_allowed was given (even empty)
	// AllowUnsafe lets the tool run where its guarantees cannot be
	// enforced; it loosens no guarantee (Spec.AllowUnsafe).
	AllowUnsafe bool
}

// ParseOverrides reads one [capability_overrides."<tool id>"] table as
// decoded from TOML; where names it in errors.
func ParseOverrides(m map[string]any, where string) (Overrides, error) {
	o := Overrides{Set: map[Key]bool{}}
	for k, v := range m {
		switch {
		case k == string(SecretsAllowed):
			list, ok := v.([]any)
			if !ok {
				return Overrides{}, fmt.Errorf("%s.%s: want a list of names, got %T", where, k, v)
			}
			o.SecretsSet, o.SecretsAllowed = true, []string{}
			for i, e := range list {
				s, ok := e.(string)
				if !ok || !validEnvName(s) {
					return Overrides{}, fmt.Errorf("%s.%s[%d]: want a variable name, got %v", where, k, i, e)
				}
				o.SecretsAllowed = append(o.SecretsAllowed, s)
			}
		case k == "allow_unsafe_execution" || slices.Contains(Keys, Key(k)):
			b, ok := v.(bool)
			if !ok {
				return Overrides{}, fmt.Errorf("%s.%s: want true or false, got %T", where, k, v)
			}
			if k == "allow_unsafe_execution" {
				o.AllowUnsafe = b
			} else {
				o.Set[Key(k)] = b
			}
		default:
			return Overrides{}, fmt.Errorf("%s: unknown key %q (want %s, secrets_allowed, allow_unsafe_execution)", where, k, joinKeys(Keys))
		}
	}
	return o, nil
}

func joinKeys(ks []Key) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// Derive computes a tool's effective guarantees: the declaration, then the
// operator's overrides (tighten only), then the trust ceiling (tighten
// only). Every step can only add guarantees or narrow secrets. Notes lists
// what an override asked that was not applied because it would loosen.
func Derive(decl Declared, over Overrides, trust Declared) (g Guarantees, notes []string) {
	g = Guarantees{Set: map[Key]bool{}, From: map[Key]Source{}, Pure: decl.Pure,
		ReadPaths: slices.Clone(decl.ReadPaths), WritePaths: slices.Clone(decl.WritePaths)}
	for _, k := range decl.keys() {
		g.tighten(k, FromDeclaration)
	}
	if decl.Pack != nil {
		for _, k := range decl.Pack.keys() {
			g.tighten(k, FromPack)
		}
	}
	if !decl.Pure {
		g.SecretsAllowed = uniqueSorted(decl.Secrets)
	}
	g.SecretsFrom = FromDeclaration

	for _, k := range sortedKeys(over.Set) {
		switch {
		case over.Set[k]:
			g.tighten(k, FromOverride)
		case g.Set[k]:
			notes = append(notes, fmt.Sprintf("%s = false would loosen a guarantee set by %s; ignored", k, g.From[k]))
		}
	}
	if over.SecretsSet {
		narrowed, dropped := intersect(g.SecretsAllowed, over.SecretsAllowed)
		for _, n := range dropped {
			notes = append(notes, fmt.Sprintf("secrets_allowed: %q is not allowed by %s; ignored", n, g.SecretsFrom))
		}
		if len(narrowed) < len(g.SecretsAllowed) {
			g.SecretsFrom = FromOverride
		}
		g.SecretsAllowed = narrowed
	}

	for _, k := range trust.keys() {
		g.tighten(k, FromTrust)
	}
	if trust.Secrets != nil {
		narrowed, _ := intersect(g.SecretsAllowed, trust.Secrets)
		if len(narrowed) < len(g.SecretsAllowed) {
			g.SecretsFrom = FromTrust
		}
		g.SecretsAllowed = narrowed
	}
	return g, notes
}

// intersect keeps the names of have that want lists, and returns the names
// of want that have lacks.
func intersect(have, want []string) (kept, dropped []string) {
	kept = []string{}
	for _, n := range uniqueSorted(want) {
		if slices.Contains(have, n) {
			kept = append(kept, n)
		} else {
			dropped = append(dropped, n)
		}
	}
	return kept, dropped
}

func uniqueSorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return slices.Compact(out)
}

func sortedKeys(m map[Key]bool) []Key {
	ks := make([]Key, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
