//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// TestVerifyProdFlagsOldPins: a capgate.lock written before capgate pinned
// launches still lets its tools run, but verify --prod fails on it, naming
// each such tool and `capgate tools lock`, in text and in --json; the lock
// that command writes passes.
func TestVerifyProdFlagsOldPins(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds capgate")
	}
	if sandbox.Probe().LandlockABI < 1 {
		t.Skip("needs Landlock for the commands' guarantees")
	}
	dir := t.TempDir()
	packs := filepath.Join(dir, "packs")
	command := func(name string) string {
		return "  " + name + ":\n    description: Say hi\n    run: [\"/bin/echo\", \"{}\"]\n    risk: LOW\n    side_effects: []\n" +
			"    capabilities: {network: none, filesystem: none}\n"
	}
	writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), "id: probe\nname: Probe\ndescription: Probe\ncommands:\n"+command("p")+command("q"))
	cfg := filepath.Join(dir, "capgate.toml")
	writeFile(t, cfg, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"data\"\nsocket = \"-\"\n\n"+
		"[policy]\nrequire_lock = true\ngrants = [\"rye.fetch.*\"]\n\n[extensions]\npaths = [%q]\n", packs))
	s := &served{bin: testkit.Build(t, capgatePkg), config: cfg, dir: dir}
	env := []string{"CAPGATE_TOKEN_SECRET=verify-test-secret-value-0a9b8c7d"}
	if out, errb, code := s.run(t, env, "tools", "lock", "--config", cfg); code != 0 {
		t.Fatalf("tools lock: %d %s %s", code, out, errb)
	}
	if out, errb, code := s.run(t, env, "verify", "--prod", "--config", cfg); code != 0 {
		t.Fatalf("verify --prod fails on the lock tools lock wrote: %d %s %s", code, out, errb)
	}

	// The lock as capgate wrote it before launches were pinned: each
	// definition without its launch, no definitions sidecar.
	var lock strings.Builder
	for _, id := range []string{"ext:probe:p", "ext:probe:q"} {
		out, errb, code := s.run(t, env, "tools", "show", id, "--config", cfg)
		var d tool.Descriptor
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil || len(d.Launch) == 0 {
			t.Fatalf("tools show %s: %d %s %s", id, code, out, errb)
		}
		d.Launch = nil
		lock.WriteString(id + " " + registry.DefinitionHash(&d) + "\n")
	}
	writeFile(t, filepath.Join(dir, registry.LockFile), lock.String())
	if err := os.Remove(filepath.Join(dir, registry.LockFile+registry.DefsSuffix)); err != nil {
		t.Fatal(err)
	}
	out, errb, code := s.run(t, env, "tools", "list", "--config", cfg)
	if code != 0 || strings.Count(out, "available") != 2 {
		t.Fatalf("the tools do not run under their old pins: %d %s %s", code, out, errb)
	}
	out, errb, code = s.run(t, env, "verify", "--prod", "--config", cfg)
	if code != 1 {
		t.Errorf("verify --prod: exit %d, want 1\n%s%s", code, out, errb)
	}
	want := func(id string) string {
		return cfg + ": capgate.lock: " + id + " runs under an outdated pin: capgate.lock pinned it before it pinned launches"
	}
	for _, id := range []string{"ext:probe:p", "ext:probe:q"} {
		if !strings.Contains(errb, want(id)) || !strings.Contains(errb, "run `capgate tools lock`") {
			t.Errorf("verify --prod does not name %s's old pin:\n%s", id, errb)
		}
	}
	out, errb, code = s.run(t, env, "verify", "--prod", "--config", cfg, "--json")
	var v struct {
		OK       bool     `json:"ok"`
		Problems []string `json:"problems"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &v) != nil || v.OK ||
		!slices.ContainsFunc(v.Problems, func(p string) bool { return strings.HasPrefix(p, want("ext:probe:q")) }) {
		t.Errorf("verify --prod --json: exit %d, %s %s", code, out, errb)
	}
}
