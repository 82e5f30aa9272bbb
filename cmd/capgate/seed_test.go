package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestCapabilityListGroupChat: capability.list, through the real CLI and
// a real serve, lists a group-chat caller only what it may call; asked
// for unavailable ones too, it shows the sensitive capability as
// unavailable with the chat gate's reason. A private chat sees it callable.
func TestCapabilityListGroupChat(t *testing.T) {
	s := startServe(t, "")
	type entry struct {
		ID                string
		Available         bool
		UnavailableReason string `json:"unavailable_reason"`
	}
	list := func(tok string, args ...string) map[string]entry {
		t.Helper()
		out, errb, code := s.as(t, tok, append([]string{"list"}, args...)...)
		var res struct{ Capabilities []entry }
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("list %v: %d %s %s", args, code, out, errb)
		}
		m := map[string]entry{}
		for _, c := range res.Capabilities {
			m[c.ID] = c
		}
		return m
	}
	group := s.mint(t, "alice", "group")
	if got := list(group); len(got) == 0 {
		t.Fatal("a group caller sees nothing")
	} else if _, ok := got["gog.email"]; ok {
		t.Errorf("a group caller is listed gog.email (sensitive, private only): %+v", got["gog.email"])
	}
	all := list(group, "--include-unavailable")
	if e, ok := all["gog.email"]; !ok || e.Available || !strings.Contains(e.UnavailableReason, "capability_access_denied") ||
		!strings.Contains(e.UnavailableReason, "private") {
		t.Errorf("gog.email with --include-unavailable for a group caller = %+v, want unavailable with the chat reason", e)
	}
	if e := all["gog.calendar"]; !e.Available || e.UnavailableReason != "" {
		t.Errorf("gog.calendar (group allowed) = %+v, want available", e)
	}
	if e, ok := list(s.mint(t, "alice", "private"))["gog.email"]; !ok || !e.Available {
		t.Errorf("gog.email for a private caller = %+v, want available", e)
	}
}

// TestAshGogDefaultWiring: a carried-over Ash config whose only gog line
// is [skills.gog] enabled = true gets Ash's default provider wiring
// (`gogcli bridge`, namespace gog): config check says so, and a real serve
// runs the gogcli it finds in PATH (here the bridge fixture) and lists its
// capabilities.
func TestAshGogDefaultWiring(t *testing.T) {
	const ash = "\n[policy]\ngrants = [\"rye.fetch.*\"]\n\n[skills.gog]\nenabled = true\n"
	path := filepath.Join(t.TempDir(), "capgate.toml")
	if err := os.WriteFile(path, []byte("[server]\ndata_dir = \"data\"\n"+ash), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"config", "check", "--config", path}, &out, &errb); code != 0 ||
		out.String() != path+":7: skills.gog: enabled = true applies Ash's default provider wiring: command = [\"gogcli\", \"bridge\"], namespace = \"gog\"\n"+path+": OK\n" {
		t.Errorf("config check: exit %d\nstdout %q\nstderr %q", code, out.String(), errb.String())
	}

	bin := t.TempDir()
	if err := os.Symlink(testkit.Build(t, testkit.BridgeFixture), filepath.Join(bin, "gogcli")); err != nil {
		t.Fatal(err)
	}
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Config: ash, Env: []string{"PATH=" + bin + ":" + os.Getenv("PATH")}}))
	stdout, stderr, code := s.as(t, s.mint(t, "alice", "private"), "list")
	if code != 0 || !strings.Contains(stdout, `"id": "gog.email"`) {
		t.Errorf("capability list with [skills.gog] enabled = true: %d\n%s\n%s\nserve logged:\n%s", code, stdout, stderr, s.logs())
	}
}
