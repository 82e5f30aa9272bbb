// Package risk classifies tools and grants: risk levels, side-effect tags,
// the tiers and policies of capability_risk.yaml, and inference for tools
// that declare nothing. It imports only permissions.
package risk

import (
	"fmt"
	"strings"
)

// Level is a tool's risk: LOW < MED < HIGH < CRITICAL. The zero Level means
// "not set", so a declaration can leave it to inference.
type Level uint8

const (
	Unset Level = iota
	Low
	Med
	High
	Critical
)

// Levels lists the levels from lowest to highest.
var Levels = []Level{Low, Med, High, Critical}

var levelNames = [...]string{Unset: "", Low: "LOW", Med: "MED", High: "HIGH", Critical: "CRITICAL"}

func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return fmt.Sprintf("Level(%d)", uint8(l))
}

// ParseLevel reads LOW, MED (or MEDIUM), HIGH or CRITICAL, in any case.
func ParseLevel(s string) (Level, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "LOW":
		return Low, nil
	case "MED", "MEDIUM":
		return Med, nil
	case "HIGH":
		return High, nil
	case "CRITICAL":
		return Critical, nil
	}
	return Unset, fmt.Errorf("unknown risk level %q: valid levels are LOW, MED, HIGH, CRITICAL", s)
}

// MarshalText makes a Level a JSON and YAML string.
func (l Level) MarshalText() ([]byte, error) {
	if l > Critical {
		return nil, fmt.Errorf("invalid risk level %d", uint8(l))
	}
	return []byte(l.String()), nil
}

// UnmarshalText reads a Level with ParseLevel; an empty text is Unset.
func (l *Level) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*l = Unset
		return nil
	}
	v, err := ParseLevel(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}
