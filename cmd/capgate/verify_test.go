//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
)

// TestVerifyProd: capgate verify --prod passes a clean config (exit 0) and
// fails each problem alone (exit 1), naming it.
func TestVerifyProd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds capgate")
	}
	if sandbox.Probe().LandlockABI < 1 {
		t.Skip("needs Landlock for the clean config's guarantees")
	}
	bin := testkit.Build(t, capgatePkg)
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	packs := filepath.Join(t.TempDir(), "packs")
	manifest := fmt.Sprintf("id: probe\nname: Probe\ndescription: Probe\ncommands:\n  p:\n    description: Print an id\n"+
		"    run: [%q, \"--json\", \"id\"]\n    risk: LOW\n    capabilities: {network: none, filesystem: read}\n", hostile)
	writeFile(t, filepath.Join(packs, "probe", "extension.yaml"), manifest)
	base := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"data\"\nsocket = \"-\"\n\n"+
		"[policy]\ngrants = [\"rye.fetch.*\"]\n\n[extensions]\npaths = [%q]\n", packs)
	const secretEnv = "CAPGATE_TOKEN_SECRET=verify-test-secret-value-0a9b8c7d"

	type setup struct {
		config string           // after base
		prep   func(dir string) // before verify runs
		env    []string         // verify's environment beyond PATH
		args   []string         // beyond verify --prod --config F
		wrap   string           // runs verify through this (NoLandlock)
		want   []string         // in stderr; none: exit 0
	}
	run := func(name string, s setup) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "capgate.toml")
			if err := os.WriteFile(cfg, []byte(base+s.config), 0o600); err != nil {
				t.Fatal(err)
			}
			if s.prep != nil {
				s.prep(dir)
			}
			argv := append([]string{bin, "verify", "--prod", "--config", cfg}, s.args...)
			if s.wrap != "" {
				argv = append([]string{s.wrap}, argv...)
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, s.env...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if len(s.want) == 0 {
				if code != 0 || !strings.Contains(out.String(), "fit for production") {
					t.Errorf("exit %d, want 0\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
				}
				return
			}
			if code != 1 {
				t.Errorf("exit %d, want 1\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
			}
			for _, w := range s.want {
				if w = strings.ReplaceAll(w, "%DIR%", dir); !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
		})
	}
	secret := []string{secretEnv}
	unsafe := "\n[capability_overrides.\"ext:probe:p\"]\nallow_unsafe_execution = true\n"

	run("clean", setup{env: secret})
	run("unsafe override", setup{config: unsafe, env: secret,
		want: []string{`capability_overrides."ext:probe:p".allow_unsafe_execution`, "--allow-unsafe accepts it"}})
	run("unsafe override allowed", setup{config: unsafe, env: secret, args: []string{"--allow-unsafe"}})
	run("development key", setup{want: []string{"auth.secret_env: $CAPGATE_TOKEN_SECRET is unset here", "development key"}})
	run("anonymous", setup{config: "\n[auth.anonymous]\nsub = \"guest\"\ngrants = [\"rye.fetch.*\"]\n", env: secret,
		want: []string{"auth.anonymous: callers without a token are let in"}})
	requireLock := func(dir string) {
		cfg := filepath.Join(dir, "capgate.toml")
		b, _ := os.ReadFile(cfg)
		os.WriteFile(cfg, bytes.Replace(b, []byte("[policy]\n"), []byte("[policy]\nrequire_lock = true\n"), 1), 0o600)
	}
	run("require_lock without a lock", setup{env: secret, prep: requireLock,
		want: []string{"policy.require_lock: " + filepath.Join("%DIR%", "capgate.lock") + " is missing", "ext:probe:p is quarantined"}})
	run("a tool the lock does not pin", setup{env: secret, prep: func(dir string) {
		requireLock(dir)
		os.WriteFile(filepath.Join(dir, "capgate.lock"), []byte("ext:probe:other sha256:"+strings.Repeat("0", 64)+"\n"), 0o644)
	}, want: []string{"ext:probe:p is quarantined: it is not in capgate.lock"}})
	run("key file readable by others", setup{env: secret, prep: func(dir string) {
		os.Mkdir(filepath.Join(dir, "data"), 0o700)
		os.WriteFile(filepath.Join(dir, "data", "token.secret"), []byte("00\n"), 0o644)
	}, want: []string{"token.secret is readable by others (mode 0644)"}})
	run("data dir open to others", setup{env: secret, prep: func(dir string) {
		os.Mkdir(filepath.Join(dir, "data"), 0o755)
		os.Chmod(filepath.Join(dir, "data"), 0o755)
	}, want: []string{"is open to others (mode 0755)"}})
	run("config writable by others", setup{env: secret, prep: func(dir string) {
		os.Chmod(filepath.Join(dir, "capgate.toml"), 0o666)
	}, want: []string{"the config is writable by others (mode 0666)"}})
	run("guarantees unenforceable here", setup{env: secret, wrap: testkit.Build(t, testkit.NoLandlock),
		want: []string{"ext:probe:p: guarantees not enforceable on this kernel: no_filesystem_write needs Landlock"}})
	run("baseline unenforceable here", setup{env: secret, wrap: testkit.Build(t, testkit.NoLandlock),
		want: []string{"sandbox: the baseline of every tool is not enforced on this kernel"}})
	run("tools run as root", setup{config: "\n[sandbox]\nrun_as = \"root\"\n", env: secret,
		want: []string{`sandbox.run_as: "root" keeps a root capgate's tools root`}})
	run("a tool that declares nothing", setup{env: secret,
		config: fmt.Sprintf("\n[mcp.servers.open]\ncommand = %q\n", testkit.Build(t, testkit.MCPFixture)),
		want:   []string{"mcp:open:echo: declares nothing it cannot do", "declare [mcp.servers.open] capabilities"}})
	run("an upstream down", setup{env: secret,
		config: fmt.Sprintf("\n[mcp.servers.down]\nurl = \"http://%s/mcp\"\n", testkit.FreeAddr(t)),
		want:   []string{"mcp:down: the source is down"}})
	run("a config capgate would refuse", setup{config: "\n[nonsense]\nx = 1\n", env: secret, want: []string{"nonsense"}})
}
