package risk

import (
	"fmt"
	"slices"
	"strings"
)

// SideEffect is one tag of what a tool does to the world.
type SideEffect string

const (
	FSRead              SideEffect = "fs.read"
	FSWrite             SideEffect = "fs.write"
	FSDelete            SideEffect = "fs.delete"
	FSChmod             SideEffect = "fs.chmod"
	NetworkHTTP         SideEffect = "network.http"
	NetworkSocket       SideEffect = "network.socket"
	NetworkDNS          SideEffect = "network.dns"
	CloudKeyRead        SideEffect = "cloud.key_read"
	CloudKeyWrite       SideEffect = "cloud.key_write"
	CloudResourceCreate SideEffect = "cloud.resource_create"
	CloudResourceDelete SideEffect = "cloud.resource_delete"
	Payments            SideEffect = "payments"
	SystemExec          SideEffect = "system.exec"
	SystemEnv           SideEffect = "system.env"
	DatabaseRead        SideEffect = "database.read"
	DatabaseWrite       SideEffect = "database.write"
	DatabaseDelete      SideEffect = "database.delete"
)

// SideEffects lists every known tag.
var SideEffects = []SideEffect{
	FSRead, FSWrite, FSDelete, FSChmod,
	NetworkHTTP, NetworkSocket, NetworkDNS,
	CloudKeyRead, CloudKeyWrite, CloudResourceCreate, CloudResourceDelete,
	Payments, SystemExec, SystemEnv,
	DatabaseRead, DatabaseWrite, DatabaseDelete,
}

// writeEffects change the world; a read-only tool has none of them.
var writeEffects = []SideEffect{
	FSWrite, FSDelete, FSChmod, CloudKeyWrite, CloudResourceCreate,
	CloudResourceDelete, Payments, SystemExec, DatabaseWrite, DatabaseDelete,
}

// Writes reports whether the effect changes something.
func (e SideEffect) Writes() bool { return slices.Contains(writeEffects, e) }

// ParseSideEffect reads a known tag; an unknown one is an error that lists
// the valid tags.
func ParseSideEffect(s string) (SideEffect, error) {
	e := SideEffect(strings.TrimSpace(s))
	if slices.Contains(SideEffects, e) {
		return e, nil
	}
	names := make([]string, len(SideEffects))
	for i, v := range SideEffects {
		names[i] = string(v)
	}
	return "", fmt.Errorf("unknown side effect %q: valid side effects are %s", s, strings.Join(names, ", "))
}

// ParseSideEffects reads a list of tags, naming the position of a bad one.
func ParseSideEffects(list []string) ([]SideEffect, error) {
	out := make([]SideEffect, 0, len(list))
	for i, s := range list {
		e, err := ParseSideEffect(s)
		if err != nil {
			return nil, fmt.Errorf("side_effects[%d]: %w", i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// UnmarshalText rejects unknown tags when a SideEffect is decoded from JSON,
// YAML or TOML.
func (e *SideEffect) UnmarshalText(b []byte) error {
	v, err := ParseSideEffect(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// Provenance says where a tool's level or side effects came from.
type Provenance string

const (
	FromOperator  Provenance = "operator" // capgate.toml overrides
	FromSource    Provenance = "declared" // the source's own declaration
	FromInference Provenance = "inferred"
)

// EffectPolicy is what the operator's [policy.side_effects] says of a
// tool with a side effect, enforced like a tier's policy: allow, or
// acknowledge (the caller must acknowledge the tag itself, as it
// acknowledges a tier: the token's ack claim, [policy] acknowledge), or
// deny (no call runs a tool with it, whoever calls).
type EffectPolicy string

const (
	EffectAllow       EffectPolicy = "allow"
	EffectAcknowledge EffectPolicy = "acknowledge"
	EffectDeny        EffectPolicy = "deny"
)

// EffectPolicies lists the policies, least strict first.
var EffectPolicies = []EffectPolicy{EffectAllow, EffectAcknowledge, EffectDeny}

// ParseEffectPolicy reads a side-effect policy; an unknown one is an error
// that lists the valid ones.
func ParseEffectPolicy(s string) (EffectPolicy, error) {
	p := EffectPolicy(s)
	if slices.Contains(EffectPolicies, p) {
		return p, nil
	}
	return "", fmt.Errorf("unknown side-effect policy %q: want allow, acknowledge or deny", s)
}
