package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Launch is what capgate.lock pins of a process capgate starts (an
// extension command, a stdio MCP server, a bridge provider): its argv, its
// work dir, the sha256 of its program and of the files its arguments name,
// and its declaration. A reload that changes it quarantines the tool,
// unless only guarantees were added (CompareLaunch).
type Launch struct {
	Run []string `json:"run"`
	// Cwd is a server's configured work dir (its script's base); an
	// extension command runs in its pack, which the pack pins already.
	Cwd string `json:"cwd,omitempty"`
	// Program is the hex sha256 of argv[0]'s bytes, "missing" when it
	// cannot be read (its start fails; its coming back is a change too).
	Program  string   `json:"program_sha256"`
	Declared Declared `json:"declared"`
	// Files are the hex sha256 of each argument that names a regular file
	// (server.py of `python3 server.py`), by the argument as written. The
	// rule has no list of interpreters: whatever file a run names is part
	// of what it runs. Nil in a pin written before capgate digested them.
	Files map[string]string `json:"files"`
}

// launchV1 is a Launch as capgate pinned it before it digested files.
type launchV1 struct {
	Run      []string `json:"run"`
	Cwd      string   `json:"cwd,omitempty"`
	Program  string   `json:"program_sha256"`
	Declared Declared `json:"declared"`
}

// NewLaunch pins argv, run from dir (a relative or bare argv[0] resolved
// as the launcher will, a relative argument against dir), under decl.
func NewLaunch(argv []string, dir string, decl Declared) Launch {
	l := Launch{Run: slices.Clone(argv), Program: "missing", Declared: decl, Files: map[string]string{}}
	if len(argv) == 0 {
		return l
	}
	for _, a := range argv[1:] {
		p := a
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); a != "" && err == nil && fi.Mode().IsRegular() {
			l.Files[a] = digest(p)
		}
	}
	if path, err := program(argv[0], dir); err == nil {
		l.Program = digest(path)
	}
	return l
}

// digest is the hex sha256 of the file at path, "missing" when it cannot
// be read.
func digest(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "missing"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "missing"
	}
	return hex.EncodeToString(h.Sum(nil))
}

// JSON is l as the pinned definition holds it.
func (l Launch) JSON() json.RawMessage {
	b, _ := json.Marshal(l)
	return b
}

// V1 is l as capgate.lock pinned it before it digested the files a run
// names: a lock that still holds it matches its tool without a diff.
func (l Launch) V1() json.RawMessage {
	b, _ := json.Marshal(launchV1{l.Run, l.Cwd, l.Program, l.Declared})
	return b
}

// Digest is the launch pin of capgate.lock files written before launches
// were pinned whole ("sha256:" of l's V1 JSON, an extension command's
// only): a lock that still holds one matches its tool without a diff.
func (l Launch) Digest() string {
	sum := sha256.Sum256(l.V1())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// UnpinnedFiles are the files now's run names that pinned, written before
// capgate digested them, does not vouch for (sorted); none when pinned
// digests files.
func UnpinnedFiles(pinned, now Launch) []string {
	if pinned.Files != nil {
		return nil
	}
	return slices.Sorted(maps.Keys(now.Files))
}

// CompareLaunch says what changed from pinned to now, each change named
// ("no_network dropped", "program sha256 1a2b3c4d… → 5e6f7a8b…"), and
// whether any of it loosens: a new run, work dir, program or file, a guarantee
// dropped, a secret, read or write path added. Guarantees that were only
// added (or paths and secrets only taken away) tighten: the launcher
// enforces them, and the tool is not quarantined for them.
func CompareLaunch(pinned, now Launch) (changes []string, loosened bool) {
	loosen := func(format string, args ...any) {
		changes, loosened = append(changes, fmt.Sprintf(format, args...)), true
	}
	if !slices.Equal(pinned.Run, now.Run) {
		loosen("run %q → %q", pinned.Run, now.Run)
	}
	if pinned.Cwd != now.Cwd {
		loosen("cwd %q → %q", pinned.Cwd, now.Cwd)
	}
	if pinned.Program != now.Program {
		loosen("program sha256 %s → %s", short(pinned.Program), short(now.Program))
	}
	// A pin without file digests vouches for none (UnpinnedFiles); one
	// with them, for exactly those files as they were.
	if pinned.Files != nil {
		for _, a := range slices.Sorted(maps.Keys(now.Files)) {
			if was, ok := pinned.Files[a]; !ok {
				loosen("file %s sha256 (not a file when pinned) → %s", a, short(now.Files[a]))
			} else if was != now.Files[a] {
				loosen("file %s sha256 %s → %s", a, short(was), short(now.Files[a]))
			}
		}
		for _, a := range slices.Sorted(maps.Keys(pinned.Files)) {
			if _, ok := now.Files[a]; !ok {
				loosen("file %s sha256 %s → (no longer a file)", a, short(pinned.Files[a]))
			}
		}
	}
	was, _ := Derive(pinned.Declared, Overrides{}, Declared{})
	is, _ := Derive(now.Declared, Overrides{}, Declared{})
	for _, k := range Keys {
		switch {
		case was.Has(k) && !is.Has(k):
			loosen("%s dropped", k)
		case !was.Has(k) && is.Has(k):
			changes = append(changes, string(k)+" added")
		}
	}
	for _, s := range is.SecretsAllowed {
		if !slices.Contains(was.SecretsAllowed, s) {
			loosen("secret %s allowed", s)
		}
	}
	for _, s := range was.SecretsAllowed {
		if !slices.Contains(is.SecretsAllowed, s) {
			changes = append(changes, "secret "+s+" withdrawn")
		}
	}
	// read_paths widen reads only under filesystem read (no writes, reads
	// not withheld); from any other mode reads were wider or are dropped
	// (a key above).
	if readMode(is) && readMode(was) {
		for _, p := range is.ReadPaths {
			if !coveredBy(p, was.ReadPaths) {
				loosen("read_paths %s added", p)
			}
		}
	}
	// Writes are limited to the work dir, the temp dir and write_paths when
	// a confined tool may write; unconfined, they are not limited at all.
	if !is.Has(NoFilesystemWrite) && !was.Has(NoFilesystemWrite) {
		switch {
		case !confined(is) && confined(was):
			loosen("writes no longer limited to write_paths %v", was.WritePaths)
		case confined(is) && confined(was):
			for _, p := range is.WritePaths {
				if !coveredBy(p, was.WritePaths) {
					loosen("write_paths %s added", p)
				}
			}
		}
	}
	return changes, loosened
}

func readMode(g Guarantees) bool { return g.Has(NoFilesystemWrite) && !g.Has(NoFilesystemRead) }

// coveredBy reports whether p is one of dirs or inside one.
func coveredBy(p string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return under(p, d) })
}

func short(digest string) string {
	if len(digest) > 12 && !strings.HasPrefix(digest, "missing") {
		return digest[:12] + "…"
	}
	return digest
}
