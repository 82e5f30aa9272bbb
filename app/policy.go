package app

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/token"
)

// Policy is the router's policy from the config.
func Policy(cfg *config.Config) router.Policy {
	p := router.Policy{
		Grants: cfg.Policy.Grants, Acknowledge: cfg.Policy.Acknowledge,
		Subjects:  map[string]router.Subject{},
		RateLimit: router.RateLimit{PerMinute: cfg.Policy.RateLimit.PerMinute, Burst: cfg.Policy.RateLimit.Burst},
	}
	for sub, v := range cfg.Policy.Subjects {
		p.Subjects[sub] = router.Subject{Grants: v.Grants, Acknowledge: v.Acknowledge}
	}
	// Checked by config; a value it did not know would read as deny.
	for tag, pol := range cfg.Policy.SideEffects {
		if p.SideEffects == nil {
			p.SideEffects = map[risk.SideEffect]risk.EffectPolicy{}
		}
		p.SideEffects[risk.SideEffect(tag)] = risk.EffectPolicy(pol)
	}
	if a := cfg.Auth.Anonymous; a != nil {
		p.Anonymous = &router.Subject{Sub: a.Sub, Grants: a.Grants, Acknowledge: a.Acknowledge}
	}
	return p
}

// RiskTable loads the risk file at path, or the built-in one when path is "".
func RiskTable(path string) (*risk.Table, error) {
	if path != "" {
		return risk.LoadTable(path)
	}
	return risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
}

// DevSecretFile holds the token key capgate makes for itself when the
// configured variable is unset, so a newcomer needs no setup; it lives in
// the data directory with mode 0600.
const DevSecretFile = "token.secret"

// ErrHS256Off is Secret's answer for a config that accepts no HS256 token.
var ErrHS256Off = errors.New("HS256 tokens are off: auth.jwks_file is set and auth.allow_hs256 is not true, so capgate has no shared key; use tokens your JWKS's issuer signs, or set auth.allow_hs256 = true to accept both")

// Secret reads the HS256 token key from the variable the config names
// (Ash's encodings: hex, base64url or raw), else from the development key
// file, which it creates on first use. source says which, without the
// value. With a JWKS and no allow_hs256 it fails with ErrHS256Off and
// makes no key: no key that would be accepted exists.
func Secret(cfg *config.Config, lookup func(string) (string, bool)) (secret []byte, source string, err error) {
	if !cfg.Auth.HS256() {
		return nil, "", ErrHS256Off
	}
	if v, ok := lookup(cfg.Auth.SecretEnv); ok && strings.TrimSpace(v) != "" {
		return token.ParseSecret(v), "$" + cfg.Auth.SecretEnv, nil
	}
	path := filepath.Join(cfg.Server.DataDir, DevSecretFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b, err = createDevSecret(cfg.Server.DataDir, path)
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading the development token key: %w", err)
	}
	// Windows reports 0666 for every file: its ACLs are not modes.
	if fi, err := os.Stat(path); err == nil && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return nil, "", fmt.Errorf("%s is readable by others: chmod 600 %s", path, path)
	}
	secret = token.ParseSecret(string(b))
	if len(secret) == 0 {
		return nil, "", fmt.Errorf("%s is empty", path)
	}
	return secret, path, nil
}

// createDevSecret makes the development key file whole or not at all: it
// is written to a temporary file and linked into place, so that processes
// starting together on one data dir (replicas, serve and a CLI) all end up
// with the one key the first link made, never a half-written file.
func createDevSecret(dir, path string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	rand.Read(key)
	b := []byte(hex.EncodeToString(key) + "\n")
	f, err := os.CreateTemp(dir, DevSecretFile+".*")
	if err != nil {
		return nil, fmt.Errorf("creating the development token key: %w", err)
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Close()); err != nil {
		return nil, fmt.Errorf("creating the development token key: %w", err)
	}
	if err := os.Link(f.Name(), path); errors.Is(err, os.ErrExist) {
		return os.ReadFile(path) // another process made it first
	} else if err != nil {
		return nil, fmt.Errorf("creating the development token key: %w", err)
	}
	return b, nil
}
