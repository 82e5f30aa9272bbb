//go:build !linux

package sandbox

import (
	"context"
	"os/exec"
	"runtime"
	"slices"
)

// Command runs argv directly: the launcher is Linux only, so a tool with
// guarantees is refused (*UnenforceableError) unless AllowUnsafe.
func (c Confinement) Command(ctx context.Context, argv []string, dir string, env, protocol []string) (*exec.Cmd, func(), error) {
	if c.Confined() && !c.AllowUnsafe {
		var miss []Missing
		for _, k := range Keys {
			if c.Guarantees.Has(k) {
				miss = append(miss, Missing{Key: k, Feature: "the Linux launcher (not on " + runtime.GOOS + ")"})
			}
		}
		return nil, nil, &UnenforceableError{Missing: miss}
	}
	d := direct(argv, dir, append(slices.Clone(env), protocol...))
	cmd := exec.CommandContext(ctx, d.Path)
	cmd.Args, cmd.Env, cmd.Dir, cmd.Err = d.Args, d.Env, d.Dir, d.Err
	return cmd, func() {}, nil
}
