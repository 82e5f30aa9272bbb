package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runSkillCLI runs the CLI in process. Until main.go registers
// newSkillCmd, it adds the command to a root of its own and maps errors to
// exit codes as run does.
func runSkillCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	for _, c := range newRootCmd().Commands() {
		if c.Name() == "skill" {
			code, stdout, stderr = runCLI(args...)
			return code, stdout, stderr
		}
	}
	var out, errb bytes.Buffer
	root := newRootCmd()
	root.AddCommand(newSkillCmd())
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	if err := root.Execute(); err != nil {
		var ee *exitError
		if !errors.As(err, &ee) {
			ee = &exitError{code: exitUsage, err: err}
		}
		if ee.err != nil {
			fmt.Fprintln(&errb, "capgate:", ee.err)
		}
		return ee.code, out.String(), errb.String()
	}
	return exitOK, out.String(), errb.String()
}

func writeSkillFile(t *testing.T, root, rel, content string) string {
	t.Helper()
	path := filepath.Join(root, rel)
	writeFile(t, path, content)
	return path
}

// writeFile writes content to path (mode 0644), making its directory.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSkillValidate(t *testing.T) {
	dir := t.TempDir()
	good := writeSkillFile(t, dir, "skills/email/SKILL.md", "---\ndescription: Read mail\n---\nRead it.\n")
	notes := writeSkillFile(t, dir, "skills/notes.md", "---\ndescription: |\n  Take notes\n  in the notebook\n---\nWrite.\n")
	bad := writeSkillFile(t, dir, "bad/deploy.md", "---\nname: deploy\nmax_iterations: 0\n---\nDeploy.\n")

	code, out, errb := runSkillCLI(t, "skill", "validate", good)
	if code != 0 || out != "ok  "+good+"  email: Read mail\n" || errb != "" {
		t.Fatalf("good: %d\n%s\n%s", code, out, errb)
	}

	code, out, errb = runSkillCLI(t, "skill", "validate", bad)
	want := bad + ":3: field max_iterations: must be at least 1, got 0\n" +
		bad + ":1: field description is required: say in one line what the skill does and when to use it\n"
	if code != 1 || out != "" || errb != want {
		t.Fatalf("bad: %d\nstdout: %s\nstderr: %s\nwant stderr: %s", code, out, errb, want)
	}

	// A skills directory: every skill in it.
	code, out, errb = runSkillCLI(t, "skill", "validate", filepath.Join(dir, "skills"))
	if code != 0 || out != "ok  "+good+"  email: Read mail\nok  "+notes+"  notes: Take notes\n" || errb != "" {
		t.Fatalf("dir: %d\n%s\n%s", code, out, errb)
	}
	// A skill's own directory.
	code, out, _ = runSkillCLI(t, "skill", "validate", filepath.Join(dir, "skills", "email"))
	if code != 0 || out != "ok  "+good+"  email: Read mail\n" {
		t.Fatalf("skill dir: %d\n%s", code, out)
	}
	// Good and bad together, and a directory with a bad skill.
	code, out, errb = runSkillCLI(t, "skill", "validate", good, filepath.Join(dir, "bad"))
	if code != 1 || !strings.Contains(out, "ok  "+good) || !strings.Contains(errb, bad+":3: field max_iterations") {
		t.Fatalf("mixed: %d\n%s\n%s", code, out, errb)
	}
	// A directory without skills.
	empty := t.TempDir()
	code, _, errb = runSkillCLI(t, "skill", "validate", empty)
	if code != 1 || errb != empty+": no skills here: a skill is <name>/SKILL.md or <name>.md\n" {
		t.Fatalf("empty: %d\n%s", code, errb)
	}
	// A path that does not exist is bad input.
	code, _, errb = runSkillCLI(t, "skill", "validate", filepath.Join(dir, "nope.md"))
	if code != 2 || !strings.Contains(errb, "nope.md: no such file or directory") {
		t.Fatalf("missing: %d\n%s", code, errb)
	}
	code, _, errb = runSkillCLI(t, "skill", "validate")
	if code != 2 || !strings.Contains(errb, "requires at least 1 arg") {
		t.Fatalf("no args: %d\n%s", code, errb)
	}
}

func TestSkillList(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, "home")
	t.Setenv("HOME", home)
	ws := filepath.Join(root, "ws")
	installed := filepath.Join(root, "installed")
	writeSkillFile(t, installed, "email.md", "---\ndescription: Mail, installed\nenv: [GOG_ACCOUNT]\n---\nDo.\n")
	userEmail := writeSkillFile(t, home, ".capgate/skills/email/SKILL.md", "---\ndescription: Mail, user\nenv: [GOG_ACCOUNT]\ncapabilities: [gog.email]\n---\nDo.\n")
	writeSkillFile(t, home, ".capgate/skills/notes.md", "---\ndescription: Notes\n---\nDo.\n")
	wsDeploy := writeSkillFile(t, ws, "skills/deploy.md", "---\ndescription: Deploy\n---\nDo.\n")
	brokenEmail := writeSkillFile(t, ws, "skills/email.md", "---\ndescription: Mail, workspace\nenv: [gog_account]\n---\nDo.\n")

	code, out, errb := runSkillCLI(t, "skill", "list", "--workspace", ws, "--skills-dir", installed)
	wantOut := "" +
		"NAME    SOURCE     STATE        DESCRIPTION\n" +
		"deploy  workspace  enabled      Deploy\n" +
		"email   user       unavailable  Mail, user\n" +
		"notes   user       enabled      Notes\n"
	wantErr := brokenEmail + `:3: field env: "gog_account" is not an UPPER_CASE environment variable name (letters A-Z, digits and _, not starting with a digit); did you mean "GOG_ACCOUNT"?` +
		" (" + userEmail + " stays in effect) [workspace]\n" +
		`skill email needs the environment variable GOG_ACCOUNT: set it in the config, [skills.email] env = { GOG_ACCOUNT = "..." }; the skill is not enabled [config]` + "\n"
	if code != 1 || out != wantOut || errb != wantErr {
		t.Fatalf("list: %d\nstdout:\n%s\nstderr:\n%s\nwant stderr:\n%s", code, out, errb, wantErr)
	}

	// With a config beside the workspace: the workspace defaults to its
	// directory, and its [skills.NAME] tables apply.
	if err := os.Remove(brokenEmail); err != nil {
		t.Fatal(err)
	}
	cfg := writeSkillFile(t, ws, "capgate.toml", "[skills.email]\nenv = { GOG_ACCOUNT = \"me@example.com\" }\nmodel = \"large\"\n\n[skills.deploy]\nenabled = false\n")
	code, out, errb = runSkillCLI(t, "skill", "list", "--config", cfg, "--json")
	if code != 0 || errb != "" {
		t.Fatalf("json: %d\n%s\n%s", code, out, errb)
	}
	var got struct {
		Skills []struct {
			Name, Source, State, Model, Path string
			Grants                           []string
		}
		Problems []any
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Skills) != 3 || len(got.Problems) != 0 ||
		got.Skills[0].Name != "deploy" || got.Skills[0].State != "disabled" || got.Skills[0].Path != wsDeploy ||
		got.Skills[1].Name != "email" || got.Skills[1].State != "enabled" || got.Skills[1].Model != "large" || got.Skills[1].Source != "user" ||
		len(got.Skills[1].Grants) != 1 || got.Skills[1].Grants[0] != "rye.execute.tool.bridge.gog.email.*" {
		t.Fatalf("json: %s", out)
	}

	// ./capgate.toml is read when it exists, and gives the workspace.
	t.Chdir(ws)
	code, out, _ = runSkillCLI(t, "skill", "list")
	if code != 0 || !strings.Contains(out, "deploy  workspace  disabled") || !strings.Contains(out, "email   user       enabled") {
		t.Fatalf("default config: %d\n%s", code, out)
	}

	// An unknown [skills.NAME] is a problem; a bad config is bad input.
	writeSkillFile(t, ws, "capgate.toml", "[skills.emial]\nmodel = \"x\"\n")
	code, _, errb = runSkillCLI(t, "skill", "list")
	if code != 1 || !strings.Contains(errb, `[skills.emial] in the config: there is no skill "emial" (did you mean "email"?`) {
		t.Fatalf("unknown skill: %d\n%s", code, errb)
	}
	code, _, errb = runSkillCLI(t, "skill", "list", "--config", filepath.Join(root, "nope.toml"))
	if code != 2 || !strings.Contains(errb, "nope.toml") {
		t.Fatalf("missing config: %d\n%s", code, errb)
	}

	// No skills at all.
	t.Setenv("HOME", t.TempDir())
	empty := t.TempDir()
	t.Chdir(empty)
	code, out, _ = runSkillCLI(t, "skill", "list", "--workspace", empty)
	if code != 0 || out != "no skills (looked in ~/.capgate/skills, "+filepath.Join(empty, "skills")+")\n" {
		t.Fatalf("no skills: %d\n%s", code, out)
	}
}
