// Package capgate holds what the whole module shares from its root: the
// default risk classification, embedded in the binary, and the version.
package capgate

import _ "embed"

// DefaultRiskFile is capability_risk.yaml as shipped. risk.ParseTable reads it.
//
//go:embed capability_risk.yaml
var DefaultRiskFile []byte

// DefaultRiskFileName names the embedded file in messages.
const DefaultRiskFileName = "capability_risk.yaml (built in)"

// Version is set at build time with -ldflags "-X github.com/capgate/capgate.Version=v1.2.3".
var Version = "dev"
