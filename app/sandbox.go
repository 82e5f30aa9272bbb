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

// RunAs is the user tools run as: [sandbox] run_as when capgate is root,
// capgate's own user (nil) otherwise or when unset. Unset, a root
// capgate's tools stay root but hold no capability (the baseline).
// (Defaulting to nobody is the aim; the suite's fixtures and the
// quickstart's `go run` server still need a user with a home.)
func RunAs(cfg *config.Config) *sandbox.User {
	if os.Geteuid() != 0 || cfg.Sandbox.RunAs == "" {
		return nil
	}
	u, _ := sandbox.ParseUser(cfg.Sandbox.RunAs) // checked at load
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
