//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Spec is one program to start confined to its guarantees.
type Spec struct {
	Path       string            // the program, an absolute path
	Args       []string          // its arguments, without argv[0]
	Dir        string            // working directory; writable unless no_filesystem_write
	Env        []string          // the environment capgate would give it; under no_env_read only EnvAllow of it passes
	Secrets    map[string]string // secret values; only names in Guarantees.SecretsAllowed reach the tool
	Guarantees Guarantees
	ReadPaths  []string // operator-listed paths the tool may read (filesystem read and write)
	Own        []string // the tool's own files (its pack's dir): readable under every guarantee
	WritePaths []string // operator-listed paths the tool may write (filesystem write)
	Deny       []string // never readable, whatever else allows: capgate's data dir, key files, config
	// Credential runs the tool as another user (nil: capgate's own). A
	// non-root credential gets a user namespace for no_network, as an
	// unprivileged capgate would.
	Credential *syscall.Credential
	// Trampoline is the binary whose main calls Main first; "" is
	// os.Executable(), capgate itself.
	Trampoline string
	// AllowUnsafe starts the tool even when a guarantee cannot be enforced
	// here (the operator's allow_unsafe_execution). It loosens nothing.
	AllowUnsafe bool
	// Observe, when set, is told of each socket() and new process the
	// kernel refuses the tool under no_network and no_subprocess (from
	// another goroutine, until cleanup returns). Under no_network a socket
	// of any family but AF_UNIX is then refused, as without a network
	// namespace.
	Observe func(Key) `json:"-"`
}

// EnvAllow is what of capgate's environment reaches a tool that
// guarantees no_env_read: enough to run a program, nothing about the host.
var EnvAllow = []string{"PATH", "LANG", "LC_ALL", "TZ"}

// SystemDirs are readable (and executable) by every confined tool: what
// running a dynamically linked program needs.
var SystemDirs = []string{"/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc"}

// deviceFiles are readable and writable by every confined tool.
var deviceFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// specEnv carries the plan from capgate to its trampoline.
const specEnv = "CAPGATE_SANDBOX_SPEC"

// plan is everything the trampoline applies, decided by the parent.
type plan struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`

	Landlock   bool     `json:"landlock"`
	ReadDirs   []string `json:"read_dirs"`
	ReadFiles  []string `json:"read_files"`
	WriteDirs  []string `json:"write_dirs"`
	WriteFiles []string `json:"write_files"`
	NoTCP      bool     `json:"no_tcp"` // Landlock denies TCP bind and connect

	NoSocket bool `json:"no_socket"` // seccomp refuses socket() but AF_UNIX
	NoFork   bool `json:"no_fork"`   // seccomp refuses new processes
	// Notify hands both to capgate (fd 3), which refuses and records them.
	Notify bool `json:"notify"`
}

// Command builds the *exec.Cmd that starts spec's program confined to its
// guarantees: capgate re-executes itself as a trampoline (see Main), which
// applies Landlock and seccomp to itself and then execs the program.
// cleanup removes the tool's private temporary directory; call it after the
// command has ended. Stdio, context and process group are the caller's to set.
func Command(spec Spec) (cmd *exec.Cmd, cleanup func(), err error) {
	return command(spec, probed())
}

// probed is Probe, asked once: what the kernel supports does not change
// while capgate runs, and an extension command starts on every call.
var probed = sync.OnceValue(Probe)

func command(spec Spec, f Features) (*exec.Cmd, func(), error) {
	if !filepath.IsAbs(spec.Path) {
		return nil, nil, fmt.Errorf("sandbox: program %q: not an absolute path", spec.Path)
	}
	g := spec.Guarantees
	feat, unprivileged := f.forLaunch(spec.Credential)
	miss := feat.missing(g, spec.Deny)
	if len(miss) > 0 && !spec.AllowUnsafe {
		return nil, nil, &UnenforceableError{Missing: miss}
	}
	self := spec.Trampoline
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, nil, fmt.Errorf("sandbox: finding capgate's own binary: %w", err)
		}
	}

	tmp, err := os.MkdirTemp("", "capgate-tool-")
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: private temp dir: %w", err)
	}
	cleanup := func() { os.RemoveAll(tmp) }
	if c := spec.Credential; c != nil {
		if err := os.Chown(tmp, int(c.Uid), int(c.Gid)); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("sandbox: private temp dir: %w", err)
		}
	}

	p := plan{Path: spec.Path, Argv: append([]string{spec.Path}, spec.Args...), Dir: spec.Dir,
		Env: buildEnv(spec, tmp)}
	if f.LandlockABI >= 1 {
		if err := p.filesystem(spec, tmp); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	attr := &syscall.SysProcAttr{Credential: spec.Credential}
	if g.Has(NoNetwork) {
		switch {
		case feat.NetNS:
			attr.Cloneflags |= syscall.CLONE_NEWNET
			if unprivileged {
				attr.Cloneflags |= syscall.CLONE_NEWUSER
				uid, gid := os.Getuid(), os.Getgid()
				if c := spec.Credential; c != nil {
					uid, gid = int(c.Uid), int(c.Gid)
				}
				// Inside, the tool keeps its own ids; it gains nothing
				// outside the namespace.
				attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
				attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
				attr.GidMappingsEnableSetgroups = false
				if c := spec.Credential; c != nil {
					c2 := *c
					c2.NoSetGroups = true
					attr.Credential = &c2
				}
			}
		default:
			p.NoTCP, p.NoSocket = p.Landlock, true
		}
	}
	p.NoFork = g.Has(NoSubprocess)
	var sup *supervisor
	if spec.Observe != nil && f.Seccomp && (p.NoFork || g.Has(NoNetwork)) {
		p.NoSocket = p.NoSocket || g.Has(NoNetwork)
		p.Notify = true
		if sup, err = newSupervisor(spec.Observe); err != nil {
			cleanup()
			return nil, nil, err
		}
		removeTmp := cleanup
		cleanup = func() { sup.stop(); removeTmp() }
	}

	js, err := json.Marshal(p)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("sandbox: encoding the plan: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Args = []string{"capgate-sandbox", spec.Path}
	cmd.Env = []string{specEnv + "=" + string(js)}
	cmd.Dir = spec.Dir
	cmd.SysProcAttr = attr
	if sup != nil {
		cmd.ExtraFiles = []*os.File{sup.child} // fd 3 in the trampoline
	}
	return cmd, cleanup, nil
}

// forLaunch is what f can enforce for a tool started with cred: a tool
// that is not root outside needs a user namespace for its network one.
func (f Features) forLaunch(cred *syscall.Credential) (feat Features, unprivileged bool) {
	unprivileged = !f.Privileged || (cred != nil && cred.Uid != 0)
	feat = f
	if unprivileged {
		feat.NetNS = feat.NetNS && feat.UserNS
	}
	return feat, unprivileged
}

// missing is Check plus the deny paths, which hold capgate's keys:
// unprovable, they fail closed too.
func (f Features) missing(g Guarantees, deny []string) []Missing {
	miss := f.Check(g)
	if len(deny) > 0 && f.LandlockABI < 1 {
		miss = append(miss, Missing{Key: "deny", Feature: "Landlock"})
	}
	return miss
}

// buildEnv is the tool's whole environment: capgate's (or under no_env_read
// only EnvAllow of it), a private TMPDIR, and the allowed secrets.
func buildEnv(spec Spec, tmp string) []string {
	env := []string{}
	for _, kv := range spec.Env {
		name, _, _ := strings.Cut(kv, "=")
		if _, secret := spec.Secrets[name]; secret {
			continue // a secret arrives only through SecretsAllowed
		}
		if spec.Guarantees.Has(NoEnvRead) && !slices.Contains(EnvAllow, name) {
			continue
		}
		if name == "TMPDIR" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "TMPDIR="+tmp)
	for _, name := range spec.Guarantees.SecretsAllowed {
		if v, ok := spec.Secrets[name]; ok {
			env = append(env, name+"="+v)
		}
	}
	return env
}

// filesystem decides the Landlock rules. Reads: the system dirs, the
// program's own dir and, unless no_filesystem_read, the listed read paths;
// with writes allowed, everything. Writes: none under no_filesystem_write,
// else the work dir, the private temp dir and the listed write paths. Deny
// paths are carved out of all of it.
func (p *plan) filesystem(spec Spec, tmp string) error {
	g := spec.Guarantees
	deny, err := resolveAll(spec.Deny)
	if err != nil {
		return fmt.Errorf("sandbox: deny path: %w", err)
	}
	reads := append(append(slices.Clone(SystemDirs), filepath.Dir(spec.Path)), spec.Own...)
	var writes []string
	switch {
	case g.Has(NoFilesystemRead):
	case g.Has(NoFilesystemWrite):
		reads = append(reads, spec.ReadPaths...)
	default:
		reads = []string{"/"}
		writes = append([]string{tmp}, spec.WritePaths...)
		if spec.Dir != "" {
			writes = append(writes, spec.Dir)
		}
	}
	for _, d := range deny {
		if under(spec.Path, d) {
			return fmt.Errorf("sandbox: program %s is inside the denied %s", spec.Path, d)
		}
	}
	rd, rf, err := carve(reads, deny)
	if err != nil {
		return err
	}
	wd, wf, err := carve(writes, deny)
	if err != nil {
		return err
	}
	p.Landlock = true
	p.ReadDirs, p.ReadFiles, p.WriteDirs = rd, rf, wd
	p.WriteFiles = append(wf, deviceFiles...)
	return nil
}

func resolveAll(paths []string) ([]string, error) {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%q: not an absolute path", p)
		}
		r, err := filepath.EvalSymlinks(p)
		if errors.Is(err, os.ErrNotExist) {
			r, err = filepath.Clean(p), nil
		}
		if err != nil {
			return nil, fmt.Errorf("%q: %w", p, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// under reports whether p is d or inside it.
func under(p, d string) bool {
	return p == d || d == "/" || strings.HasPrefix(p, d+"/")
}

// carve returns roots, as dirs and files, with every deny path cut out: a
// root that holds a deny path is replaced by its other entries, level by
// level (Landlock only allows, so a hole is made by allowing around it).
// Entries created later beside a deny path stay unreachable: fail closed.
func carve(roots, deny []string) (dirs, files []string, err error) {
	var walk func(r string) error
	walk = func(r string) error {
		// Resolve first: a symlink into a deny path must not open it.
		r, err := filepath.EvalSymlinks(r)
		if err != nil {
			return nil // a missing or dangling root allows nothing
		}
		fi, err := os.Stat(r)
		if err != nil {
			return nil
		}
		inside := false
		for _, d := range deny {
			if under(r, d) {
				return nil
			}
			if under(d, r) {
				inside = true
			}
		}
		switch {
		case !fi.IsDir():
			files = append(files, r)
		case !inside:
			dirs = append(dirs, r)
		default:
			ents, err := os.ReadDir(r)
			if err != nil {
				return fmt.Errorf("sandbox: carving deny paths out of %s: %w", r, err)
			}
			for _, e := range ents {
				if err := walk(filepath.Join(r, e.Name())); err != nil {
					return err
				}
			}
		}
		return nil
	}
	resolved, err := resolveAll(roots)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: path: %w", err)
	}
	for _, r := range resolved {
		if err := walk(r); err != nil {
			return nil, nil, err
		}
	}
	return dirs, files, nil
}
