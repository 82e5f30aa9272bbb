package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// An Ash-style config loads unchanged, through the CLI with a real bridge
// provider: UPPER_CASE keys in [skills.NAME] are the skill's env, a disabled
// skill's provider is not started, and [capabilities.providers.X] overrides
// [skills.X.capability_provider] field by field, its command coming from the
// skill's table.
func TestAshSkillConfig(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	ws := t.TempDir()
	bridge := testkit.Build(t, testkit.BridgeFixture)
	writeSkillFile(t, ws, "skills/gog/SKILL.md", "---\ndescription: Google, through gogcli\nenv: [GOG_ACCOUNT, GOG_REGION]\n---\nDo.\n")
	writeSkillFile(t, ws, "skills/mail.md", "---\ndescription: Mail\n---\nDo.\n")
	cfg := writeSkillFile(t, ws, "capgate.toml", fmt.Sprintf(`[skills.gog]
GOG_ACCOUNT = "me@example.com"
env = { GOG_REGION = "eu" }

[skills.gog.capability_provider]
command = [%q]
timeout_seconds = 10
env = ["BRIDGE_FIXTURE_MODE"]

[capabilities.providers.gog]
env = []

[skills.mail]
enabled = false

[skills.mail.capability_provider]
command = [%q]
`, bridge, bridge))

	// The skill's table passes this through and the provider would crash;
	// the operator's env = [] overrides it.
	t.Setenv("BRIDGE_FIXTURE_MODE", "exit3")
	var out, errb bytes.Buffer
	if code := run([]string{"tools", "list", "--config", cfg, "--source", "bridge"}, &out, &errb); code != 0 {
		t.Fatalf("tools list: %d\n%s\n%s", code, out.String(), errb.String())
	}
	list := out.String()
	// The merged provider runs the skill's command with the operator's env;
	// the disabled skill's provider is not there at all.
	if !strings.Contains(list, "bridge:gog:email.list_messages") || !strings.Contains(list, "bridge:gog:calendar.list_events") {
		t.Errorf("tools list: no tools of the merged provider:\n%s", list)
	}
	if strings.Contains(list, "bridge:mail:") || strings.Contains(errb.String(), "bridge:mail") {
		t.Errorf("tools list: the disabled skill's provider is wired:\n%s\n%s", list, errb.String())
	}
	// The same provider, its skill disabled and no explicit table: not
	// started, so none of its tools.
	off := writeSkillFile(t, t.TempDir(), "capgate.toml", fmt.Sprintf("[skills.gog]\nenabled = false\n\n[skills.gog.capability_provider]\ncommand = [%q]\n", bridge))
	t.Setenv("BRIDGE_FIXTURE_MODE", "")
	out.Reset()
	errb.Reset()
	if code := run([]string{"tools", "list", "--config", off, "--source", "bridge"}, &out, &errb); code != 0 || out.String() != "no tools\n" {
		t.Errorf("tools list, skill disabled: %d, want no tools\n%s\n%s", code, out.String(), errb.String())
	}

	code, sout, serr := runSkillCLI(t, "skill", "list", "--config", cfg, "--json")
	if code != 0 || serr != "" {
		t.Fatalf("skill list: %d\n%s\n%s", code, sout, serr)
	}
	var got struct {
		Skills []struct{ Name, State string }
	}
	if err := json.Unmarshal([]byte(sout), &got); err != nil {
		t.Fatal(err)
	}
	// gog needs GOG_ACCOUNT (a key of its table) and GOG_REGION (its env).
	if len(got.Skills) != 2 || got.Skills[0].Name != "gog" || got.Skills[0].State != "enabled" ||
		got.Skills[1].Name != "mail" || got.Skills[1].State != "disabled" {
		t.Fatalf("skill list: %s", sout)
	}

	// A lower-case unknown key is still an error, with file and line.
	bad := writeSkillFile(t, t.TempDir(), "capgate.toml", "[skills.gog]\nGOG_ACCOUNT = \"me\"\nmodle = \"x\"\nGOG_PORT = 8080\n")
	code, _, serr = runSkillCLI(t, "skill", "list", "--config", bad)
	if code != 2 || !strings.Contains(serr, filepath.Base(bad)+":3: skills.gog.modle: unknown key") ||
		!strings.Contains(serr, ":4: skills.gog.GOG_PORT: is a TOML integer; want a string") {
		t.Fatalf("bad config: %d\n%s", code, serr)
	}
}
