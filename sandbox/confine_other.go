//go:build !linux

package sandbox

import (
	"context"
	"os/exec"
	"runtime"
	"slices"

	"github.com/capgate/capgate/tool"
)

func (c Confinement) missing() []Missing {
	var miss []Missing
	for _, k := range Keys {
		if c.Guarantees.Has(k) {
			miss = append(miss, Missing{Key: k, Feature: "the Linux launcher (not on " + runtime.GOOS + ")"})
		}
	}
	return miss
}

// Describe is c as operators and callers see it: off Linux no guarantee
// is enforced.
func (c Confinement) Describe() *tool.Guarantees { return c.describe(c.missing()) }

// Command runs argv directly: the launcher is Linux only, so a tool with
// guarantees is refused (*UnenforceableError) unless AllowUnsafe.
func (c Confinement) Command(ctx context.Context, argv []string, dir string, env, protocol []string) (*exec.Cmd, func(), error) {
	if err := c.Held.Check(); err != nil {
		return nil, nil, err
	}
	if c.Confined() && !c.AllowUnsafe {
		return nil, nil, &UnenforceableError{Missing: c.missing()}
	}
	return direct(ctx, argv, dir, append(slices.Clone(env), protocol...)), func() {}, nil
}

// BaselineMissing says what this platform lacks for the baseline.
func BaselineMissing() string {
	return "the Linux launcher (not on " + runtime.GOOS + "): every tool runs with capgate's own rights"
}

// PrepareTemp has nothing to do: only the Linux launcher makes temp dirs.
func PrepareTemp() error { return nil }

// ReleaseTemp has nothing to do: only the Linux launcher makes temp dirs.
func ReleaseTemp() {}
