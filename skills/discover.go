package skills

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The sources of skills, lowest precedence first.
const (
	SourceBundled     = "bundled"
	SourceIntegration = "integration"
	SourceInstalled   = "installed"
	SourceUser        = "user"
	SourceWorkspace   = "workspace"
)

// Sources lists the sources, lowest precedence first: a skill in a later
// source overrides one of the same name in an earlier one.
var Sources = []string{SourceBundled, SourceIntegration, SourceInstalled, SourceUser, SourceWorkspace}

// Options says where Discover looks. Each directory is a skills directory
// holding <name>/SKILL.md and <name>.md files. Within one source, a later
// directory overrides an earlier one.
type Options struct {
	Bundled     []string
	Integration []string
	Installed   []string
	// User is the user's skills directory; default <Home>/.capgate/skills.
	// A leading ~/ is the home directory.
	User string
	// Workspace is the workspace directory; its skills are in
	// <Workspace>/skills. "" for none.
	Workspace string
	// Home is the home directory; default os.UserHomeDir.
	Home string
}

// Problem is a skill file that could not be used, or a config table that
// does not fit the skills. Err names the file (and line) itself.
type Problem struct {
	Source string // a source, or "config" for Apply's problems
	Path   string // the file, directory or config; "" when there is none
	Name   string // the skill's name, "" when unknown
	Line   int    // the line of the (first) problem, 0 when unknown
	Err    error
}

func (p Problem) Error() string { return p.Err.Error() }
func (p Problem) Unwrap() error { return p.Err }

func newProblem(source, path, name string, err error) Problem {
	p := Problem{Source: source, Path: path, Name: name, Err: err}
	var e *Error
	if errors.As(err, &e) {
		p.Line = e.Line
	}
	return p
}

// Set is the outcome of discovery: the skills in effect, sorted by name,
// and the problems found on the way.
type Set struct {
	Skills   []*Skill
	Problems []Problem
}

// Get returns the skill in effect called name, or nil.
func (s *Set) Get(name string) *Skill {
	i, ok := slices.BinarySearchFunc(s.Skills, name, func(sk *Skill, n string) int { return strings.Compare(sk.Name, n) })
	if !ok {
		return nil
	}
	return s.Skills[i]
}

// Names lists the names of the skills in effect.
func (s *Set) Names() []string {
	out := make([]string, len(s.Skills))
	for i, sk := range s.Skills {
		out[i] = sk.Name
	}
	return out
}

// Discover finds the skills of every source. A valid skill overrides a
// valid one of the same name from a lower source (recording its path in
// Overrides); a file that is not valid is reported in Problems and hides
// nothing, so the lower valid skill stays in effect. Directories that do
// not exist are skipped. Discover fails only when it needs the home
// directory and cannot find it.
func Discover(opts Options) (*Set, error) {
	type dir struct{ source, path string }
	var dirs []dir
	for _, s := range []struct {
		source string
		paths  []string
	}{{SourceBundled, opts.Bundled}, {SourceIntegration, opts.Integration}, {SourceInstalled, opts.Installed}} {
		for _, p := range s.paths {
			dirs = append(dirs, dir{s.source, p})
		}
	}
	user := opts.User
	if user == "" || user == "~" || strings.HasPrefix(user, "~/") {
		home := opts.Home
		if home == "" {
			h, err := os.UserHomeDir()
			if err != nil {
				return nil, fmt.Errorf("skills: the user skills directory is ~/.capgate/skills, but %w", err)
			}
			home = h
		}
		switch {
		case user == "":
			user = filepath.Join(home, ".capgate", "skills")
		case user == "~":
			user = home
		default:
			user = filepath.Join(home, user[2:])
		}
	}
	dirs = append(dirs, dir{SourceUser, user})
	if opts.Workspace != "" {
		dirs = append(dirs, dir{SourceWorkspace, filepath.Join(opts.Workspace, "skills")})
	}
	// A directory named twice is read once, for its highest-precedence source.
	abs := make([]string, len(dirs))
	for i, d := range dirs {
		abs[i] = d.path
		if a, err := filepath.Abs(d.path); err == nil {
			abs[i] = a
		}
	}

	set := &Set{}
	cur := map[string]*Skill{}
	for i, d := range dirs {
		if slices.Contains(abs[i+1:], abs[i]) {
			continue
		}
		skills, problems := LoadDir(d.path, d.source)
		set.Problems = append(set.Problems, problems...)
		for _, s := range skills {
			if prev := cur[s.Name]; prev != nil {
				s.Overrides = append(slices.Clone(prev.Overrides), prev.Path)
			}
			cur[s.Name] = s
		}
	}
	for _, s := range cur {
		set.Skills = append(set.Skills, s)
	}
	slices.SortFunc(set.Skills, func(a, b *Skill) int { return strings.Compare(a.Name, b.Name) })
	return set, nil
}

// LoadDir reads every skill in one skills directory, sorted by name, and
// reports the files it cannot use. Each skill's Source is source. In the
// directory, <name>/SKILL.md and <name>.md are both the skill <name>; when
// both exist the directory form is used and the other reported. Hidden
// entries, README.md, files not ending in .md and directories without a
// SKILL.md are not skills. A directory that does not exist has no skills.
func LoadDir(dir, source string) ([]*Skill, []Problem) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []Problem{newProblem(source, dir, "", fmt.Errorf("skills directory %s: %w", dir, err))}
	}
	var problems []Problem
	dirForm := map[string]string{}  // name -> <dir>/<name>/SKILL.md
	fileForm := map[string]string{} // name -> <dir>/<name>.md
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path) // follows symbolic links
		if err != nil {
			problems = append(problems, newProblem(source, path, "", err))
			continue
		}
		if fi.IsDir() {
			skill := filepath.Join(path, "SKILL.md")
			if _, err := os.Stat(skill); err == nil {
				dirForm[name] = skill
			} else if other := otherCase(path); other != "" {
				problems = append(problems, newProblem(source, other, name,
					&Error{Path: other, Msg: "a skill's file must be named SKILL.md, in capitals"}))
			}
			continue
		}
		base, ok := strings.CutSuffix(name, ".md")
		if !ok || base == "" || strings.EqualFold(name, "README.md") {
			continue
		}
		fileForm[base] = path
	}
	names := make([]string, 0, len(dirForm)+len(fileForm))
	for n := range dirForm {
		names = append(names, n)
	}
	for n := range fileForm {
		if _, ok := dirForm[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)

	var skills []*Skill
	for _, name := range names {
		path, ok := dirForm[name]
		if file, both := fileForm[name]; ok && both {
			problems = append(problems, newProblem(source, file, name, &Error{Path: file,
				Msg: fmt.Sprintf("skill %q is also defined by %s; the directory form is used: remove one of them", name, path)}))
		} else if !ok {
			path = file
		}
		s, err := ReadFile(path)
		if err != nil {
			problems = append(problems, newProblem(source, path, name, err))
			continue
		}
		s.Source = source
		skills = append(skills, s)
	}
	return skills, problems
}

// otherCase returns a file in dir whose name is SKILL.md in another case.
func otherCase(dir string) string {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.EqualFold(e.Name(), "SKILL.md") {
			return filepath.Join(dir, e.Name())
		}
	}
	return ""
}

// ReadFile reads and parses one skill file.
func ReadFile(path string) (*Skill, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}
