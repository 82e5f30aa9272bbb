package skills

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// write creates the file root/rel with its parent directories.
func write(t *testing.T, root, rel, content string) string {
	t.Helper()
	path := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func skillMD(description string) string {
	return "---\ndescription: " + description + "\n---\nDo the thing.\n"
}

func TestDiscover(t *testing.T) {
	root := t.TempDir()
	bundled := filepath.Join(root, "bundled")
	integration := filepath.Join(root, "integration")
	installed1 := filepath.Join(root, "installed1")
	installed2 := filepath.Join(root, "installed2")
	home := filepath.Join(root, "home")
	user := filepath.Join(home, ".capgate", "skills")
	workspace := filepath.Join(root, "ws")
	wsSkills := filepath.Join(workspace, "skills")

	alphaBundled := write(t, bundled, "alpha/SKILL.md", skillMD("alpha from bundled"))
	betaBundled := write(t, bundled, "beta.md", skillMD("beta from bundled"))
	gammaBundled := write(t, bundled, "gamma.md", skillMD("gamma from bundled"))
	betaIntegration := write(t, integration, "beta/SKILL.md", skillMD("beta from integration"))
	gammaInstalled1 := write(t, installed1, "gamma.md", skillMD("gamma from installed1"))
	gammaInstalled2 := write(t, installed2, "gamma/SKILL.md", skillMD("gamma from installed2"))
	betaUser := write(t, user, "beta.md", skillMD("beta from user"))
	write(t, user, "delta.md", skillMD("delta from user"))
	// Broken in a higher source: the installed gamma stays in effect.
	gammaUserBroken := write(t, user, "gamma.md", "---\nname: gamma\n---\nDo it.\n")
	// Both forms in one directory: the directory form wins, the file is reported.
	betaWorkspace := write(t, wsSkills, "beta/SKILL.md", skillMD("beta from workspace"))
	betaWorkspaceFile := write(t, wsSkills, "beta.md", skillMD("beta from workspace, file form"))
	// Broken: the bundled alpha stays in effect.
	alphaWorkspaceBroken := write(t, wsSkills, "alpha.md", "---\nname: alpha2\ndescription: d\n---\nDo it.\n")
	write(t, wsSkills, "epsilon/SKILL.md", skillMD("epsilon from workspace"))
	zetaLower := write(t, wsSkills, "zeta/skill.md", skillMD("zeta"))
	// Not skills.
	write(t, wsSkills, "README.md", "# My skills\n")
	write(t, wsSkills, "notes.txt", "notes\n")
	write(t, wsSkills, ".draft.md", "not yet\n")
	write(t, wsSkills, "assets/logo.svg", "<svg/>\n")

	set, err := Discover(Options{
		Bundled: []string{bundled}, Integration: []string{integration},
		Installed: []string{installed1, installed2, filepath.Join(root, "missing")},
		Home:      home, Workspace: workspace,
	})
	if err != nil {
		t.Fatal(err)
	}

	type row struct {
		name, source, path, description string
		overrides                       []string
	}
	var got []row
	for _, s := range set.Skills {
		got = append(got, row{s.Name, s.Source, s.Path, s.Description, s.Overrides})
	}
	want := []row{
		{"alpha", "bundled", alphaBundled, "alpha from bundled", nil},
		{"beta", "workspace", betaWorkspace, "beta from workspace", []string{betaBundled, betaIntegration, betaUser}},
		{"delta", "user", filepath.Join(user, "delta.md"), "delta from user", nil},
		{"epsilon", "workspace", filepath.Join(wsSkills, "epsilon", "SKILL.md"), "epsilon from workspace", nil},
		{"gamma", "installed", gammaInstalled2, "gamma from installed2", []string{gammaBundled, gammaInstalled1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("skills\n got %+v\nwant %+v", got, want)
	}
	if set.Get("gamma").Path != gammaInstalled2 || set.Get("nope") != nil || set.Get("aaa") != nil || set.Get("zzz") != nil {
		t.Errorf("Get")
	}

	type prob struct {
		source, path, name string
		line               int
		err                string
	}
	var gotP []prob
	for _, p := range set.Problems {
		gotP = append(gotP, prob{p.Source, p.Path, p.Name, p.Line, p.Error()})
	}
	wantP := []prob{
		{"user", gammaUserBroken, "gamma", 1, gammaUserBroken + ":1: field description is required: say in one line what the skill does and when to use it"},
		{"workspace", zetaLower, "zeta", 0, zetaLower + ": a skill's file must be named SKILL.md, in capitals"},
		{"workspace", alphaWorkspaceBroken, "alpha", 2, alphaWorkspaceBroken +
			`:2: field name: "alpha2" does not match the skill's name "alpha", which comes from its file alpha.md; make them equal, or leave name out`},
		{"workspace", betaWorkspaceFile, "beta", 0, betaWorkspaceFile + `: skill "beta" is also defined by ` + betaWorkspace +
			"; the directory form is used: remove one of them"},
	}
	if !reflect.DeepEqual(gotP, wantP) {
		t.Errorf("problems\n got %+v\nwant %+v", gotP, wantP)
	}
}

func TestDiscoverUserDir(t *testing.T) {
	root := t.TempDir()
	write(t, root, "mine/one.md", skillMD("one"))
	// ~/ in User is the home directory; no workspace.
	set, err := Discover(Options{User: "~/mine", Home: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Skills) != 1 || set.Skills[0].Source != "user" || set.Skills[0].Path != filepath.Join(root, "mine", "one.md") || len(set.Problems) != 0 {
		t.Fatalf("%+v %+v", set.Skills, set.Problems)
	}
	// The same directory as two sources is read once, for the higher one.
	set, err = Discover(Options{Installed: []string{filepath.Join(root, "mine")}, User: filepath.Join(root, "mine")})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Skills) != 1 || set.Skills[0].Source != "user" || set.Skills[0].Overrides != nil {
		t.Fatalf("%+v", set.Skills[0])
	}
}

func TestLoadDirUnreadable(t *testing.T) {
	root := t.TempDir()
	file := write(t, root, "file", "x")
	skills, problems := LoadDir(file, "installed")
	if skills != nil || len(problems) != 1 || problems[0].Path != file ||
		!strings.Contains(problems[0].Error(), "skills directory "+file+": ") {
		t.Fatalf("%+v %+v", skills, problems)
	}
	skills, problems = LoadDir(filepath.Join(root, "nope"), "installed")
	if skills != nil || problems != nil {
		t.Fatalf("%+v %+v", skills, problems)
	}
}
