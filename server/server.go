// Package server is capgate's front door: it wires a config into a
// router (registry, token verifier, store, audit log) and serves the
// capability RPC and the MCP endpoint over HTTP and a Unix socket.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
)

// Options are the seams of Open.
type Options struct {
	Logger    *slog.Logger
	LookupEnv func(string) (string, bool)
	// SkillsDirs are directories of installed skills (serve --skills-dir),
	// a later one overriding an earlier one.
	SkillsDirs []string
}

// Server is a running capgate: its parts, built from one config.
type Server struct {
	Config   *config.Config
	Router   *router.Router
	Registry *registry.Registry
	Store    *store.Store
	Audit    *audit.Log
	MCP      *MCP
	// SecretSource says where the token keys came from, for the start banner.
	SecretSource string
	// HS256 says whether HS256 tokens are accepted (see config.Auth.HS256).
	HS256 bool
	// Limits bound the front door's requests.
	Limits Limits

	logger   *slog.Logger
	draining atomic.Bool // /readyz fails: Serve is shutting down
	stopKeys func()      // ends a remote JWKS's refresh
	cancel   context.CancelFunc
	done     chan struct{}
}

// Open builds every part cfg names. Close releases them.
func Open(ctx context.Context, cfg *config.Config, opts Options) (_ *Server, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	s := &Server{Config: cfg, logger: opts.Logger, done: make(chan struct{}), Limits: Limits{
		HeaderTimeout: cfg.Server.HeaderTimeout.Std(), MaxRequestBytes: int64(cfg.Server.MaxRequestBytes),
		DrainDelay: cfg.Server.DrainDelay.Std(),
	}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	table, err := RiskTable(cfg.Policy.RiskFile)
	if err != nil {
		return nil, err
	}
	secret, source, err := Secret(cfg, opts.LookupEnv)
	if err != nil && !errors.Is(err, ErrHS256Off) {
		return nil, err
	}
	s.HS256 = secret != nil
	s.SecretSource = source
	vopts := token.Options{Secret: secret, Audience: cfg.Auth.Audience}
	if cfg.Auth.JWKSFile != "" {
		if vopts.JWKS, err = os.ReadFile(cfg.Auth.JWKSFile); err != nil {
			return nil, fmt.Errorf("%s: auth.jwks_file: %w", cfg.Path, err)
		}
		if s.SecretSource != "" {
			s.SecretSource += " and "
		}
		s.SecretSource += "JWKS " + cfg.Auth.JWKSFile
	}
	// A remote JWKS is refreshed until Close.
	keysCtx, stopKeys := context.WithCancel(context.WithoutCancel(ctx))
	s.stopKeys = stopKeys
	if err := oidcOptions(keysCtx, cfg, &vopts, opts.Logger, &s.SecretSource); err != nil {
		return nil, err
	}
	// Bridge providers' keys are derived from the token key, or without
	// HS256 from a key of this process's own that never leaves it: no
	// front door accepts a token signed with either.
	master := secret
	if master == nil {
		master = make([]byte, 32)
		rand.Read(master)
	}
	bridgeKey := func(ns string) ([]byte, error) { return token.BridgeKey(master, ns) }
	verifier, err := token.NewVerifier(vopts)
	if err != nil {
		return nil, fmt.Errorf("%s: auth: %w", cfg.Path, err)
	}
	if s.Store, err = store.Open(ctx, cfg.Server.DataDir, store.Options{LookupEnv: opts.LookupEnv}); err != nil {
		return nil, err
	}
	if s.Audit, err = audit.Open(cfg.Audit.Path, auditOptions(cfg, opts.Logger)); err != nil {
		return nil, err
	}
	if s.Registry, err = registry.Build(ctx, cfg, registry.BuildOptions{BridgeKey: bridgeKey, Logger: opts.Logger, LookupEnv: opts.LookupEnv}); err != nil {
		return nil, err
	}
	s.Router, err = router.New(router.Options{
		Registry: s.Registry, Verifier: verifier, Risk: table, Policy: Policy(cfg),
		State: s.Store, Audit: s.Audit, Secret: master, Logger: opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	s.MCP = NewMCP(s.Router, s.Registry)
	if err := s.loadSkills(opts.SkillsDirs); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		go s.prune(runCtx)
		s.Registry.Run(runCtx)
	}()
	return s, nil
}

// auditOptions are the audit log's options from [audit]. Its health is
// said once per change, loudly: while it is unhealthy the router refuses
// every call, and a line per refusal would flood the log of a full disk.
func auditOptions(cfg *config.Config, logger *slog.Logger) audit.Options {
	maxSize := int64(config.DefaultAuditMaxSize)
	if cfg.Audit.MaxSize != nil {
		maxSize = int64(*cfg.Audit.MaxSize)
	}
	return audit.Options{
		MaxSize:  maxSize,
		MaxFiles: cfg.Audit.MaxFiles,
		Reserve:  int64(cfg.Audit.Reserve), // 0: the audit package's default
		OnHealth: func(err error) {
			if err != nil {
				logger.Error("audit log cannot record calls: refusing every call (capability_backend_unavailable) until it can; make room for it",
					"path", cfg.Audit.Path, "err", err)
				return
			}
			logger.Info("audit log recovered: calls are served again", "path", cfg.Audit.Path)
		},
	}
}

// prune drops expired flows, idempotency records and approvals now and then.
func (s *Server) prune(ctx context.Context) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Store.Prune(ctx); err != nil && ctx.Err() == nil {
				s.logger.Warn("pruning the store failed", "err", err)
			}
		}
	}
}

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
		if err := os.MkdirAll(cfg.Server.DataDir, 0o700); err != nil {
			return nil, "", err
		}
		key := make([]byte, 32)
		rand.Read(key)
		b = []byte(hex.EncodeToString(key) + "\n")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, "", fmt.Errorf("creating the development token key: %w", err)
		}
		_, werr := f.Write(b)
		if err := errors.Join(werr, f.Close()); err != nil {
			return nil, "", err
		}
	} else if err != nil {
		return nil, "", fmt.Errorf("reading the development token key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, "", fmt.Errorf("%s is readable by others: chmod 600 %s", path, path)
	}
	secret = token.ParseSecret(string(b))
	if len(secret) == 0 {
		return nil, "", fmt.Errorf("%s is empty", path)
	}
	return secret, path, nil
}

// ServeStdio serves one MCP client over in and out as the caller whose
// token is raw (or the anonymous caller), until ctx ends or in closes.
func (s *Server) ServeStdio(ctx context.Context, raw string, in io.Reader, out io.Writer) error {
	c, err := s.Router.Authenticate(raw)
	if err != nil {
		return err
	}
	stdio := mcpserver.NewStdioServer(s.MCP.Server())
	stdio.SetContextFunc(func(ctx context.Context) context.Context { return WithCaller(ctx, c) })
	return stdio.Listen(ctx, in, out)
}

// Close stops the sources, flushes the audit log and closes the store.
func (s *Server) Close() error {
	var errs []error
	if s.stopKeys != nil {
		s.stopKeys()
	}
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	if s.Registry != nil {
		errs = append(errs, s.Registry.Close())
	}
	if s.Audit != nil {
		errs = append(errs, s.Audit.Close())
	}
	if s.Store != nil {
		errs = append(errs, s.Store.Close())
	}
	return errors.Join(errs...)
}

// loadSkills finds the skills (installed in dirs, user ~/.capgate/skills,
// workspace <config dir>/skills, later overriding earlier), applies
// [skills.NAME] and serves the enabled ones. A skill that cannot be used
// is logged and explained to whoever asks for it.
func (s *Server) loadSkills(dirs []string) error {
	set, err := skills.Discover(skills.Options{Installed: dirs, Workspace: s.Config.Dir})
	if err != nil {
		return fmt.Errorf("skills: %w", err)
	}
	enabled, problems := skills.Apply(set, s.Config.Skills)
	why := map[string]string{}
	for _, p := range append(set.Problems, problems...) {
		s.logger.Warn("skill not usable", "skill", p.Name, "source", p.Source, "path", p.Path, "err", p.Error())
		if p.Name != "" && !slices.ContainsFunc(enabled, func(e *skills.Skill) bool { return e.Name == p.Name }) {
			why[p.Name] = p.Error()
		}
	}
	s.MCP.SetSkills(enabled, why)
	return nil
}
