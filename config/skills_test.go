package config

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Ash writes a skill's environment straight into its table.
func TestSkillUpperCaseKeysAreEnv(t *testing.T) {
	c, err := parse(t, "[skills.email]\nGOG_ACCOUNT = \"me@example.com\"\nmodel = \"small\"\nenv = { TZ = \"UTC\" }\nAPI_KEY = \"${KEY}\"\n",
		map[string]string{"KEY": "k-1"})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Skills["email"]
	if s.Model != "small" || len(s.Env) != 3 || s.Env["GOG_ACCOUNT"] != "me@example.com" || s.Env["TZ"] != "UTC" || s.Env["API_KEY"] != "k-1" {
		t.Fatalf("skill %+v", s)
	}
	// The same as dotted keys and as an inline table.
	for _, src := range []string{"skills.email.GOG = \"a\"\n", "[skills]\nemail = { GOG = \"a\", model = \"m\" }\n"} {
		c, err := parse(t, src, nil)
		if err != nil || c.Skills["email"].Env["GOG"] != "a" {
			t.Errorf("%q: %v %+v", src, err, c)
		}
	}
}

func TestSkillEnvKeyErrors(t *testing.T) {
	tests := []struct {
		src  string
		want []string
	}{
		// Lower-case (and mixed) unknown keys stay errors.
		{"[skills.email]\nmodle = \"x\"\nGOG = \"a\"\n", []string{"capgate.toml:2: skills.email.modle: unknown key"}},
		{"[skills.email]\nGog_Account = \"a\"\n", []string{"capgate.toml:2: skills.email.Gog_Account: unknown key"}},
		{"[skills.email]\n_X = \"a\"\n", []string{"capgate.toml:2: skills.email._X: unknown key"}},
		{"[server]\nlisen = \"a\"\n[skills.email]\nGOG = \"a\"\n", []string{"capgate.toml:2: server.lisen: unknown key"}},
		// Values are strings.
		{"[skills.email]\nmodel = \"m\"\nPORT = 8080\n", []string{"capgate.toml:3: skills.email.PORT: is a TOML integer; want a string (an UPPER_CASE key in [skills.email] is an environment value)"}},
		{"[skills.email]\nDEBUG = true\n", []string{"capgate.toml:2: skills.email.DEBUG: is a TOML boolean; want a string"}},
		{"[skills.email.CFG]\nx = \"y\"\n", []string{"capgate.toml:1: skills.email.CFG: is a TOML table; want a string"}},
		// A key in both places.
		{"[skills.email]\nenv = { GOG = \"a\" }\nGOG = \"b\"\n", []string{"capgate.toml:3: skills.email.GOG: also set in skills.email.env; give it in one place"}},
		// [skills.defaults] holds allow_chat_ids only.
		{"[skills.defaults]\nGOG = \"a\"\n", []string{"skills.defaults: only allow_chat_ids"}},
	}
	for _, tt := range tests {
		_, err := parse(t, tt.src, nil)
		if err == nil {
			t.Errorf("%q: no error, want %q", tt.src, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q:\n error %v\n want %q", tt.src, err, w)
			}
		}
	}
}

// A wrong-typed value may still be a credential: it is never quoted back.
func TestSkillEnvErrorHidesValue(t *testing.T) {
	_, err := parse(t, "[skills.email]\nAPI_KEY = [\"sk-live-4f9a\"]\n", nil)
	if err == nil || !strings.Contains(err.Error(), "skills.email.API_KEY: is a TOML array") || strings.Contains(err.Error(), "sk-live-4f9a") {
		t.Fatalf("error %v", err)
	}
}

func TestDisabledSkillUnwiresProvider(t *testing.T) {
	c, err := parse(t, "[skills.mail]\nenabled = false\n[skills.mail.capability_provider]\ncommand = [\"mailbridge\"]\n"+
		"[skills.notes]\n[skills.notes.capability_provider]\ncommand = [\"notesbridge\"]\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := c.Providers()
	if len(ps) != 1 || ps[0].Key != "skills.notes.capability_provider" {
		t.Fatalf("providers %+v, want only notes", ps)
	}
	// Off, its table is not wired, so its namespace is free for another.
	c, err = parse(t, "[skills.mail]\nenabled = false\n[skills.mail.capability_provider]\ncommand = [\"mailbridge\"]\n"+
		"[capabilities.providers.other]\nnamespace = \"mail\"\ncommand = [\"other\"]\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps := c.Providers(); len(ps) != 1 || ps[0].Command[0] != "other" {
		t.Fatalf("providers %+v, want only other", ps)
	}
}

func TestProviderOverridesSkillTable(t *testing.T) {
	c, err := parse(t, "[skills.gog.capability_provider]\ncommand = [\"gogcli\", \"bridge\"]\ntimeout_seconds = 10\nenv = [\"GOG_HOME\"]\n\n"+
		"[capabilities.providers.gog]\ntimeout_seconds = 99\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := c.Providers()
	if len(ps) != 1 {
		t.Fatalf("providers %+v, want one merged", ps)
	}
	p := ps[0]
	if p.Key != "capabilities.providers.gog" || p.Namespace != "gog" || !slices.Equal(p.Command, []string{"gogcli", "bridge"}) ||
		p.TimeoutSeconds != 99 || !slices.Equal(p.Env, []string{"GOG_HOME"}) || !p.IsEnabled() {
		t.Fatalf("merged %+v", *p.Provider)
	}
	// Every field the operator sets wins, enabled included.
	c, err = parse(t, "[skills.gog.capability_provider]\ncommand = [\"gogcli\"]\nnamespace = \"g\"\n\n"+
		"[capabilities.providers.gog]\ncommand = [\"./bin/gog\"]\nenabled = false\nenv = []\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps := c.Providers(); len(ps) != 1 || ps[0].Command[0] != "/etc/capgate/bin/gog" || ps[0].Namespace != "g" || ps[0].IsEnabled() || ps[0].Env == nil {
		t.Fatalf("merged %+v", ps)
	}
	// A disabled skill adds nothing: the explicit table stands alone.
	_, err = parse(t, "[skills.gog]\nenabled = false\n[skills.gog.capability_provider]\ncommand = [\"gogcli\"]\n\n"+
		"[capabilities.providers.gog]\ntimeout_seconds = 5\n", nil)
	if err == nil || !strings.Contains(err.Error(), "capabilities.providers.gog.command: required") {
		t.Fatalf("error %v", err)
	}
}

// TestSkillDirs: Ash's [skills] dirs lists directories of installed skills
// beside the skill tables; relative ones are relative to the config.
func TestSkillDirs(t *testing.T) {
	c, err := parse(t, "[skills]\ndirs = [\n  \"installed\",\n  \"/opt/skills\",\n]\n[skills.tidy]\nTIDY_MODE = \"gentle\"\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.SkillDirs) != 2 || c.SkillDirs[0] != filepath.Join(c.Dir, "installed") || c.SkillDirs[1] != "/opt/skills" {
		t.Errorf("SkillDirs = %q", c.SkillDirs)
	}
	if c.Skills["tidy"].Env["TIDY_MODE"] != "gentle" || len(c.Skills) != 1 {
		t.Errorf("skills = %+v; dirs must not be read as a skill", c.Skills)
	}
	if c, err := parse(t, "skills.dirs = [\"a\"]\n", nil); err != nil || len(c.SkillDirs) != 1 {
		t.Errorf("dotted skills.dirs: %v %v", c, err)
	}
	for src, want := range map[string]string{
		"[server]\nlisten = \"127.0.0.1:1\"\n[skills]\ndirs = \"one\"\n": "capgate.toml:4: skills.dirs: want a list of directories (strings)",
		// Lines after a multi-line dirs keep their numbers.
		"[skills]\ndirs = [\n  \"a\",\n]\nbogus = 1\n": "capgate.toml:5: skills.bogus",
	} {
		if _, err := parse(t, src, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}
