package sandbox

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/capgate/capgate/harden"
)

// Where capgate cannot read the kernel's audit (unprivileged, audit off),
// a refused file is named from what the tool itself printed: a line of its
// stderr in one of the usual shapes of a refusal (EACCES, EPERM) that names
// a path, checked against the Landlock rules the launcher laid out for it
// (rules). Only a path those rules refuse is named, and it is labelled as
// the tool's report, never as the kernel's: the rules are capgate's own, the
// attempt is the tool's word. This costs nothing while a call succeeds:
// the stderr is read once a call has failed.

// rules mirrors one launch's Landlock ruleset: the resolved paths it
// allows to read and to write (directories and their trees, single files).
type rules struct {
	readDirs, readFiles, writeDirs, writeFiles []string
}

// allows says what r lets a process do to path (absolute, as the host
// sees it): read, and write (writing also creating and removing below a
// directory).
func (r *rules) allows(path string) (read, write bool) {
	p := resolveLoose(path)
	in := func(dirs, files []string) bool {
		return slices.ContainsFunc(dirs, func(d string) bool { return under(p, d) }) || slices.Contains(files, p)
	}
	write = in(r.writeDirs, r.writeFiles)
	return write || in(r.readDirs, r.readFiles), write
}

// resolveLoose resolves path's symlinks as far as it exists: a file to
// create resolves through its directory.
func resolveLoose(path string) string {
	path = filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(r, filepath.Base(path))
	}
	return path
}

// refusalLine matches a line that reports a refused access: libc's words
// (coreutils, sh, Python's PermissionError, Java), Go's, Node's and Rust's
// error codes.
var refusalLine = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)permission denied|operation not permitted|\bEACCES\b|\bEPERM\b|errno 13\b|os error 13\b`)
})

// mayRefuse is a quick test that lets through every line refusalLine
// may match (the regexp costs microseconds a line).
func mayRefuse(line string) bool {
	l := strings.ToLower(line)
	return strings.Contains(l, "denied") || strings.Contains(l, "not permitted") || strings.Contains(l, "eacces") ||
		strings.Contains(l, "eperm") || strings.Contains(l, " 13")
}

// quotedPath is an absolute path in quotes ('...', "...", ‘...’, `...').
var quotedPath = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("['\"‘`](/[^'\"’`\n]*)['\"’`]") })

// barePaths are the unquoted absolute paths in line, as [start, end)
// pairs: each from a slash at the line's start or after a space or "=" up
// to what usually follows a path in an error (": ", " (", a comma, a
// quote, the line's end). One may hold spaces (Go's "open /srv/out
// dir/x: permission denied"), so each start gives one.
func barePaths(line string) [][2]int {
	var out [][2]int
	for i := 0; i < len(line); i++ {
		if line[i] != '/' || (i > 0 && !strings.ContainsRune(" \t=", rune(line[i-1]))) {
			continue
		}
		end := len(line)
		for _, stop := range []string{": ", " (", ",", "'", `"`} {
			if j := strings.Index(line[i:], stop); j >= 0 && i+j < end {
				end = i + j
			}
		}
		out = append(out, [2]int{i, i + len(strings.TrimRight(line[i:end], ": \t"))})
	}
	return out
}

// maxReportedLines bounds the lines of stderr read for refusals (the
// last ones: a tool's refusal is most often why it gave up).
const maxReportedLines = 64

// Stderr names the files the tool reports refused in stderr (what it
// wrote during this call) and that its Landlock rules do refuse, when
// capgate read no audit records for this launch.
func (d *Denials) Stderr(stderr string) { d.Reported(stderr, "its stderr") }

// Reported is Stderr for text the tool wrote elsewhere, from says where
// ("its error result").
func (d *Denials) Reported(text, from string) {
	d.mu.Lock()
	r, audited := d.rules, d.audited
	d.mu.Unlock()
	if r == nil || audited || text == "" {
		return
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) > maxReportedLines {
		lines = lines[len(lines)-maxReportedLines:]
	}
	for _, line := range lines {
		if len(line) > 4096 {
			continue
		}
		if f, ok := r.reported(line); ok {
			f.From = from
			d.addFile(f)
		}
	}
}

// reported is the path line reports refused, when r refuses it, as a
// FileDenial the tool reported: Blockers says which of reading and writing
// r withholds. The path is the one nearest the words of the refusal (a
// shell names itself first: "/bin/sh: 1: cannot open /x: Permission
// denied"). Only the path leaves capgate, and only when it holds nothing
// shaped like a credential (harden).
func (r *rules) reported(line string) (FileDenial, bool) {
	if !mayRefuse(line) {
		return FileDenial{}, false
	}
	at := refusalLine().FindStringIndex(line)
	if at == nil {
		return FileDenial{}, false
	}
	type candidate struct {
		path string
		dist int
	}
	var cands []candidate
	add := func(start, end int) {
		dist := at[0] - end
		if start >= at[1] {
			dist = start - at[1]
		}
		if dist >= 0 {
			cands = append(cands, candidate{strings.TrimSpace(line[start:end]), dist})
		}
	}
	for _, m := range quotedPath().FindAllStringSubmatchIndex(line, -1) {
		add(m[2], m[3])
	}
	for _, m := range barePaths(line) {
		add(m[0], m[1])
	}
	// The nearest, and of those the shortest: "read=/x
	// denied open /x: permission denied" names /x.
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.dist != b.dist {
			return a.dist - b.dist
		}
		return len(a.path) - len(b.path)
	})
	for _, c := range cands {
		if c.dist != cands[0].dist {
			break
		}
		if f, ok := r.check(c.path); ok {
			return f, true
		}
	}
	return FileDenial{}, false
}

// check is p as a reported denial, when r refuses it.
func (r *rules) check(p string) (FileDenial, bool) {
	if len(p) < 2 || p != filepath.Clean(p) || !printable(p) {
		return FileDenial{}, false
	}
	if _, secret := harden.Message(p); secret {
		return FileDenial{}, false
	}
	// Whether p exists is not checked: capgate (perhaps root) would then
	// tell a caller which paths exist where the tool (as nobody) cannot
	// look. The message says it is the tool's word, made up or not.
	switch read, write := r.allows(p); {
	case !read:
		return FileDenial{Blockers: reportedRead, Path: p}, true
	case !write:
		return FileDenial{Blockers: reportedWrite, Path: p}, true
	}
	return FileDenial{}, false
}

// The Blockers of a reported denial: what the rules withhold, not what
// the kernel said.
const (
	reportedRead  = "reported:read"
	reportedWrite = "reported:write"
)

func printable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}
