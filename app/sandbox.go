package app

import (
	"os"
	"path/filepath"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/sandbox"
)

// SandboxPolicy is the operator's side of every tool's guarantees, from
// [capability_overrides] and [trust], and the paths no tool may ever read:
// capgate's data dir (keys, store, audit), its config and key files.
func SandboxPolicy(cfg *config.Config) sandbox.Policy {
	p := sandbox.Policy{Overrides: map[string]sandbox.Overrides{}, Trust: declared(cfg.Trust.AllowedCapabilities)}
	for id, m := range cfg.CapabilityOverrides {
		// Checked at load (config.validateGuarantees).
		p.Overrides[id], _ = sandbox.ParseOverrides(m, id)
	}
	for _, path := range []string{cfg.Server.DataDir, configFile(cfg), cfg.Audit.Path, cfg.Auth.JWKSFile, cfg.Server.Socket} {
		if path != "" && path != "-" {
			if abs, err := filepath.Abs(path); err == nil {
				p.Deny = append(p.Deny, abs)
			}
		}
	}
	p.RunAs = RunAs(cfg)
	return p
}

// RunAs is the user tools run as: when capgate is root, [sandbox] run_as
// or, unset, nobody; nil (capgate's own user) when capgate is not root or
// when run_as names root, the operator's opt-out (RunAsRoot).
func RunAs(cfg *config.Config) *sandbox.User {
	if os.Geteuid() != 0 {
		return nil
	}
	u := runAs(cfg)
	if u.UID == 0 {
		return nil
	}
	return u
}

// RunAsRoot reports whether cfg's run_as keeps a root capgate's tools
// root: an explicit choice, logged by serve and reported by verify --prod.
func RunAsRoot(cfg *config.Config) bool { return runAs(cfg).UID == 0 }

// runAs is [sandbox] run_as, or its default.
func runAs(cfg *config.Config) *sandbox.User {
	name := cfg.Sandbox.RunAs
	if name == "" {
		name = sandbox.DefaultRunAs
	}
	u, err := sandbox.ParseUser(name)
	if err != nil { // checked at load; the default always parses
		return sandbox.Nobody
	}
	return u
}

// declared reads a capabilities table checked at load.
func declared(m map[string]any) sandbox.Declared {
	d, _ := sandbox.ParseDeclared(m, "")
	return d
}

func configFile(cfg *config.Config) string {
	if cfg.Path == "" || filepath.IsAbs(cfg.Path) {
		return cfg.Path
	}
	return filepath.Join(cfg.Dir, filepath.Base(cfg.Path))
}
