package sandbox

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/capgate/capgate/tool"
)

// Policy is the operator's side of every tool's derivation: overrides by
// key, the trust ceiling, and the paths no tool may ever read (capgate's
// data dir, config and key files).
type Policy struct {
	// Overrides by tool id ("ext:pack:cmd"); a process that serves many
	// tools (a stdio MCP server, a bridge provider) by "kind:source"
	// ("mcp:files", "bridge:gog").
	Overrides map[string]Overrides
	Trust     Declared
	Deny      []string
	// RunAs is the user every tool runs as ([sandbox] run_as; nil:
	// capgate's own). app sets it when capgate is root.
	RunAs *User
}

// User is a user to run tools as, by numeric ids.
type User struct{ UID, GID int }

// Confinement is how one process starts: its effective guarantees, the
// paths it must never read, and its own files, which it may.
type Confinement struct {
	Guarantees Guarantees
	Deny       []string
	Own        []string
	// AllowUnsafe runs it even where its guarantees cannot be enforced.
	AllowUnsafe bool
	// RunAs is the user it runs as (nil: capgate's own).
	RunAs *User
	// Observe, set per call, is told of each socket and new process the
	// kernel refuses it (Spec.Observe).
	Observe func(Key)
	// Files, set per call, collects the files the kernel refuses it, where
	// capgate reads Landlock's audit (WatchFileDenials).
	Files *Denials
	// Declared is what its source declared, before overrides: what
	// capgate.lock pins (Launch).
	Declared Declared
	// Held, when capgate.lock pins this launch, refuses a start whose
	// program or named files changed on disk since (nil: no pin).
	Held *Held
}

// For derives the confinement of a process with declaration decl, whose
// overrides are under key. notes say what an override asked that was
// ignored because it would loosen.
func (p Policy) For(key string, decl Declared, own ...string) (Confinement, []string) {
	over := p.Overrides[key]
	g, notes := Derive(decl, over, p.Trust)
	return Confinement{Guarantees: g, Deny: slices.Clone(p.Deny), Own: own, AllowUnsafe: over.AllowUnsafe, RunAs: p.RunAs, Declared: decl}, notes
}

// Launch pins argv run from dir under c's declaration (see Launch).
func (c Confinement) Launch(argv []string, dir string) Launch {
	return NewLaunch(argv, dir, c.Declared)
}

// Unreachable says why c's user cannot run argv in dir by the file modes
// (a program in a 0700 dir with run_as nobody), nil when it can or when c
// runs as capgate's own user. The launcher enters dir before it switches
// to that user and runs a program below dir by a relative path, so only
// the directories from dir down count for it.
func (c Confinement) Unreachable(argv []string, dir string) error {
	u := c.RunAs
	if u == nil || len(argv) == 0 {
		return nil
	}
	path, err := program(argv[0], dir)
	if err != nil {
		return nil // the start says so
	}
	if dir == "" {
		if err := u.Reach(path, true); err != nil {
			return fmt.Errorf("run_as %s cannot run %s: %w", u, path, err)
		}
		return nil
	}
	if err := u.ReachFrom(dir, path, true); err != nil {
		return fmt.Errorf("run_as %s cannot run %s from %s: %w", u, path, dir, err)
	}
	return nil
}

// ObservedBy is c as one call runs it: each socket and new process the
// kernel refuses it is told to denied (a tool.Call's Denied), when set.
func (c Confinement) ObservedBy(denied func(guarantee string)) Confinement {
	if denied != nil {
		c.Observe = func(k Key) { denied(string(k)) }
	}
	return c
}

// Refusal is the caller's error for a start the launcher refused with
// *UnenforceableError: capability_backend_unavailable in the router's
// sandbox gate (router.GateSandbox, counted as a sandbox denial), hinting
// at the override under overrideKey that runs it without that proof.
func Refusal(err error, overrideKey, format string, args ...any) *tool.Error {
	e := tool.Wrap(err, tool.CodeBackendUnavailable, format, args...)
	e.Gate = "sandbox"
	e.Hint = fmt.Sprintf("[capability_overrides.%q] allow_unsafe_execution = true runs it without that proof", overrideKey)
	return e
}

// Confined reports whether c guarantees anything beyond the baseline. A
// process that guarantees nothing still starts through the launcher, with
// the baseline: capgate's own files out of reach, no capabilities,
// no_new_privs, RunAs; where the kernel lacks Landlock it starts without
// the deny paths rather than not at all (BaselineMissing says so).
func (c Confinement) Confined() bool { return confined(c.Guarantees) }

// describe shows c with miss, what this kernel lacks for it.
func (c Confinement) describe(miss []Missing) *tool.Guarantees {
	g := c.Guarantees
	out := &tool.Guarantees{Runner: tool.RunnerLocal, Keys: []tool.Guarantee{},
		SecretsAllowed: slices.Clone(g.SecretsAllowed), SecretsSource: string(g.SecretsFrom),
		Enforced: len(miss) == 0, AllowUnsafe: c.AllowUnsafe, Pure: g.Pure, Flat: map[string]bool{}}
	if out.SecretsAllowed == nil {
		out.SecretsAllowed = []string{}
	}
	if !g.Has(NoFilesystemRead) {
		out.ReadPaths = slices.Clone(g.ReadPaths)
	}
	if !g.Has(NoFilesystemWrite) {
		out.WritePaths = slices.Clone(g.WritePaths)
	}

	for _, k := range Keys {
		out.Flat[string(k)] = false
		if !g.Has(k) {
			continue
		}
		e := tool.Guarantee{Key: string(k), Source: string(g.From[k]), Enforced: true}
		for _, m := range miss {
			if m.Key == k {
				e.Enforced, e.Missing = false, m.Feature
			}
		}
		out.Keys = append(out.Keys, e)
		out.Flat[string(k)] = e.Enforced
	}
	return out
}

// direct is the start without the launcher, ended when ctx is (off Linux).
func direct(ctx context.Context, argv []string, dir string, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	return cmd
}

// program resolves argv[0] to the absolute path the launcher needs: a
// path with a slash is relative to dir, a bare name is looked up in PATH.
func program(name, dir string) (string, error) {
	if strings.ContainsRune(name, filepath.Separator) {
		if !filepath.IsAbs(name) && dir != "" {
			name = filepath.Join(dir, name)
		}
		return filepath.Abs(name)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

// under reports whether p is d or inside it.
func under(p, d string) bool {
	return p == d || d == "/" || strings.HasPrefix(p, d+"/")
}
