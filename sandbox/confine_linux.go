//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"

	"github.com/capgate/capgate/tool"
)

// Command builds the command that runs argv confined by c, ended when ctx
// is: always through the launcher, which gives even a tool that declares
// nothing the baseline.
// protocol holds capgate's own "K=V" values for the tool (a bridge's
// context-token key): they reach it whatever its env guarantees. cleanup
// is to be called once the command has ended. A tool whose guarantees
// cannot be enforced here fails with *UnenforceableError, unless
// AllowUnsafe.
func (c Confinement) Command(ctx context.Context, argv []string, dir string, env, protocol []string) (cmd *exec.Cmd, cleanup func(), err error) {
	if err := c.Held.Check(); err != nil {
		return nil, nil, err
	}
	path, err := program(argv[0], dir)
	if err == nil {
		// Checked here, as a direct start would: the trampoline could
		// only exit 126.
		_, err = os.Stat(path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: %s: %w", argv[0], err)
	}
	g := c.Guarantees
	g.SecretsAllowed = slices.Clone(g.SecretsAllowed)
	secrets := map[string]string{}
	// A declared secret in the tool's environment reaches it whatever its
	// env guarantees; the launcher otherwise drops it under no_env_read.
	for _, kv := range env {
		if name, v, _ := strings.Cut(kv, "="); slices.Contains(g.SecretsAllowed, name) {
			secrets[name] = v
		}
	}
	for _, kv := range protocol {
		name, v, _ := strings.Cut(kv, "=")
		secrets[name] = v
		g.SecretsAllowed = append(g.SecretsAllowed, name)
	}
	spec := Spec{Path: path, Args: argv[1:], Dir: dir, Env: env, Secrets: secrets,
		Guarantees: g, Deny: c.Deny, Own: c.Own, AllowUnsafe: c.AllowUnsafe, Observe: c.Observe,
		ReadPaths: g.ReadPaths, WritePaths: g.WritePaths, Files: c.Files}
	if u := c.RunAs; u != nil {
		spec.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}
	}
	launch, cleanup, err := Command(spec)
	if err != nil {
		return nil, nil, err
	}
	return withContext(ctx, launch), cleanup, nil
}

// Describe is c as operators and callers see it: each guarantee, where it
// came from, and whether this kernel enforces it for capgate as it runs.
func (c Confinement) Describe() *tool.Guarantees {
	var miss []Missing
	if c.Confined() {
		feat, _ := probed().forLaunch()
		miss = feat.missing(c.Guarantees, c.Deny)
	}
	return c.describe(miss)
}

// withContext rebuilds cmd (not yet started) so that ctx ends it.
func withContext(ctx context.Context, cmd *exec.Cmd) *exec.Cmd {
	out := exec.CommandContext(ctx, cmd.Path)
	out.Args, out.Env, out.Dir, out.SysProcAttr, out.Err = cmd.Args, cmd.Env, cmd.Dir, cmd.SysProcAttr, cmd.Err
	out.ExtraFiles = cmd.ExtraFiles
	return out
}
