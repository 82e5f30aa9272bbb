// Package capgate holds what the whole module shares from its root: the
// default risk classification, embedded in the binary. Its version is in
// internal/buildinfo, read from the build info.
package capgate

import _ "embed"

// DefaultRiskFile is capability_risk.yaml as shipped. risk.ParseTable reads it.
//
//go:embed capability_risk.yaml
var DefaultRiskFile []byte

// DefaultRiskFileName names the embedded file in messages.
const DefaultRiskFileName = "capability_risk.yaml (built in)"
