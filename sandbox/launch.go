//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/capgate/capgate/internal/nsinit"
	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/sandbox/trampoline"
	"golang.org/x/sys/unix"
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
	// Credential runs the tool as another user (nil: capgate's own): the
	// trampoline switches to it after dropping the bounding set, so root's
	// capabilities never reach the tool (Policy.RunAs).
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
	// Files, when set and capgate reads Landlock's audit, collects each
	// file access the kernel refuses the tool (WatchFileDenials).
	Files *Denials `json:"-"`
}

// EnvAllow is what of capgate's environment reaches a tool that
// guarantees no_env_read: enough to run a program, nothing about the host.
var EnvAllow = []string{"PATH", "LANG", "LC_ALL", "TZ"}

// SystemDirs are readable (and executable) by every confined tool: what
// running a dynamically linked program needs.
var SystemDirs = []string{"/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc"}

// deviceFiles are readable and writable by every confined tool.
var deviceFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// plan is everything the trampoline applies, decided here; its methods
// decide parts of it.
type plan struct{ trampoline.Plan }

// Main turns this process into the launcher's trampoline when capgate
// started it as one, and returns at once otherwise. Every binary that
// launches tools through Command calls it first thing in main (and test
// binaries in TestMain). As a trampoline it never returns: it confines
// itself and execs the tool, or exits 126 saying why not. It normally has
// run already, at package trampoline's init; where package order puts
// that late, this catches it.
func Main() { trampoline.Main() }

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
	feat, unprivileged := f.forLaunch()
	// A tool that declares nothing runs with the baseline where the kernel
	// has it; serve says once what it lacks (BaselineMissing).
	if miss := feat.missing(g, spec.Deny); len(miss) > 0 && confined(g) && !spec.AllowUnsafe {
		return nil, nil, &UnenforceableError{Missing: miss}
	}
	self := spec.Trampoline
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, nil, fmt.Errorf("sandbox: finding capgate's own binary: %w", err)
		}
	}

	root, err := tempRoot()
	if err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp(root, "capgate-tool-")
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

	p := plan{trampoline.Plan{Path: filepath.Clean(spec.Path), Argv: append([]string{spec.Path}, spec.Args...), Dir: spec.Dir,
		Env: buildEnv(spec, tmp)}}
	if f.LandlockABI >= 1 {
		if err := p.filesystem(spec, tmp); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	// The kernel kills the trampoline, then the tool, when capgate dies
	// (the trampoline sets it again after switching users, which clears
	// it). In a PID namespace of its own, the first process killed is the
	// namespace's init (internal/nsinit), and with it every process the
	// tool started.
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if feat.PidNS {
		// And a mount namespace, where init mounts a /proc of the new PID
		// namespace: the host's /proc names other processes by the
		// trampoline's PIDs (see internal/nsinit).
		attr.Cloneflags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
	}
	if c := spec.Credential; c != nil {
		p.SetUser, p.UID, p.GID = true, int(c.Uid), int(c.Gid)
	}
	if g.Has(NoNetwork) {
		switch {
		case feat.NetNS:
			attr.Cloneflags |= syscall.CLONE_NEWNET
			p.NoUnix = true
		default:
			p.NoTCP, p.NoSocket = p.Landlock, true
		}
	}
	// An unprivileged capgate starts every tool in a user namespace where
	// the kernel allows one: there the trampoline holds the CAP_SETPCAP it
	// needs to empty the bounding set.
	if unprivileged && (attr.Cloneflags != 0 || feat.UserNS) {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		// Inside, the tool keeps capgate's ids; it gains nothing outside
		// the namespace, and the trampoline drops what it has inside.
		uid, gid := os.Getuid(), os.Getgid()
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		// Its capabilities in the namespace would not survive the exec of
		// the trampoline (its uid is not 0 there) but for this one, which
		// the trampoline drops with the rest once it has emptied the
		// bounding set.
		attr.AmbientCaps = []uintptr{unix.CAP_SETPCAP}
		if attr.Cloneflags&syscall.CLONE_NEWPID != 0 {
			// And, for the namespace's init, the one that mounts its /proc
			// (init lowers it before it starts the trampoline).
			attr.AmbientCaps = append(attr.AmbientCaps, unix.CAP_SYS_ADMIN)
		}
		p.SetUser = false // an unprivileged capgate runs tools as itself
	}
	p.NoFork = g.Has(NoSubprocess)
	if p.Landlock && spec.Files != nil {
		p.AuditTag = watchTag(spec.Files)
		spec.Files.mu.Lock()
		spec.Files.deny = slices.Clone(spec.Deny)
		spec.Files.rules = &rules{readDirs: p.ReadDirs, readFiles: p.ReadFiles, writeDirs: p.WriteDirs, writeFiles: p.WriteFiles}
		spec.Files.audited = p.AuditTag != ""
		spec.Files.mu.Unlock()
		if tag := p.AuditTag; tag != "" {
			prev := cleanup
			cleanup = func() { endTag(tag); prev() }
		}
	}
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

	cmd := exec.Command(self)
	cmd.Args = []string{"capgate-sandbox", spec.Path}
	cmd.Dir = spec.Dir
	cmd.SysProcAttr = attr
	p.Alive = -1
	if self := selfPidfd(); self != nil {
		p.Alive = trampoline.AliveFD
		cmd.ExtraFiles = append(cmd.ExtraFiles, self) // fd 3 in the trampoline
	} else {
		cmd.ExtraFiles = append(cmd.ExtraFiles, nil)
	}
	if sup != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, sup.child) // fd 4
	} else {
		cmd.ExtraFiles = append(cmd.ExtraFiles, nil)
	}
	if err := p.compile(); err != nil {
		cleanup()
		return nil, nil, err
	}
	planFile, err := proc.MemFile("capgate-plan", p.Encode())
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("sandbox: handing over the plan: %w", err)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, planFile) // fd 5
	prevCleanup := cleanup
	cleanup = func() { planFile.Close(); prevCleanup() }
	// The trampoline's own environment (the tool's is the plan's): one P
	// and no watch on the cgroup's CPU limit, which spare its short-lived
	// Go runtime some of its start.
	cmd.Env = []string{trampoline.Env + "=" + strconv.Itoa(trampoline.PlanFD), "GOMAXPROCS=1", "GODEBUG=updatemaxprocs=0"}
	if feat.PidNS {
		cmd.Env = append(cmd.Env, nsinit.Env+"="+nsinit.Value(p.Alive, p.Notify))
	}
	return cmd, cleanup, nil
}

// forLaunch is what f can enforce for a tool capgate starts: the clone
// happens as capgate, so an unprivileged capgate needs a user namespace
// for its network one (the switch to Credential comes after).
func (f Features) forLaunch() (feat Features, unprivileged bool) {
	unprivileged = !f.Privileged
	feat = f
	if unprivileged {
		feat.NetNS = feat.NetNS && feat.UserNS
		feat.PidNS = feat.PidNS && feat.UserNS
	}
	return feat, unprivileged
}

// selfPidfd is capgate's own pidfd, opened once and handed to every
// trampoline: readable once capgate has exited, it closes the race between
// capgate dying and the parent-death signal being set again. nil where the
// kernel has no pidfd_open (the signal alone then).
var selfPidfd = sync.OnceValue(func() *os.File {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "capgate-pidfd")
})

// missing is Check plus the deny paths, which hold capgate's keys:
// unprovable, they fail closed too.
func (f Features) missing(g Guarantees, deny []string) []Missing {
	miss := f.Check(g)
	if len(deny) > 0 && f.LandlockABI < 1 {
		miss = append(miss, Missing{Key: "deny", Feature: "Landlock"})
	}
	if len(g.WritePaths) > 0 && f.LandlockABI < 1 {
		miss = append(miss, Missing{Key: "write_paths", Feature: "Landlock"})
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
// program's own dir, its own files, its work dir and, unless
// no_filesystem_read, the listed read paths; with writes allowed,
// everything.
// Writes: none under no_filesystem_write; under a declared write the work
// dir, the private temp dir and the listed write paths; undeclared (the
// baseline), everything. Deny paths are carved out of all of it, and its
// own files (its pack) out of every write.
func (p *plan) filesystem(spec Spec, tmp string) error {
	g := spec.Guarantees
	deny, err := resolveAll(spec.Deny)
	if err != nil {
		return fmt.Errorf("sandbox: deny path: %w", err)
	}
	own, err := resolveAll(spec.Own)
	if err != nil {
		return fmt.Errorf("sandbox: own path: %w", err)
	}
	// Its work dir is where its operator starts it (a server's script
	// sits there): readable under every guarantee, like its own files.
	reads := append(append(slices.Clone(SystemDirs), filepath.Dir(spec.Path)), spec.Own...)
	if spec.Dir != "" {
		reads = append(reads, spec.Dir)
	}
	var writes []string
	switch {
	case g.Has(NoFilesystemRead):
	case g.Has(NoFilesystemWrite):
		reads = append(reads, spec.ReadPaths...)
	case !confined(g):
		reads, writes = []string{"/"}, []string{"/"}
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
	wd, wf, err := carve(writes, append(slices.Clip(deny), own...))
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
