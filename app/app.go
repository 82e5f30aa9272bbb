// Package app is capgate's wiring: it builds every part from the config
// (risk table, token keys, store, audit log, registry, router, skills)
// and hands each its typed options. Nothing below it reads the config.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/console"
	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/router/inflight"
	"github.com/capgate/capgate/server"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/upstreamauth"
)

// Options are the seams of Open.
type Options struct {
	Logger    *slog.Logger
	LookupEnv func(string) (string, bool)
	// SkillsDirs are directories of installed skills (serve --skills-dir),
	// a later one overriding an earlier one.
	SkillsDirs []string
}

// App is a running capgate: its parts, built from one config, and the
// front door over them.
type App struct {
	Config   *config.Config
	Router   *router.Router
	Registry *registry.Registry
	Store    *store.Store
	Audit    *audit.Log
	// Metrics are collected when [server] metrics_listen serves them;
	// Tracer exports spans when the OTEL_* environment asks. nil: off.
	Metrics *telemetry.Metrics
	Tracer  *telemetry.Tracer
	// Broker holds each user's credentials for the [mcp.servers] with
	// auth; nil when none has.
	Broker *upstreamauth.Broker
	*server.Server
	// Console is the operator console ([console] listen), nil when off;
	// ServeConsole serves it.
	Console *console.Console
	// SecretSource says where the token keys came from, for the start banner.
	SecretSource string
	// HS256 says whether HS256 tokens are accepted (see config.Auth.HS256).
	HS256 bool
	// ReplicaID names this replica ([server] replica_id, or hostname-pid).
	ReplicaID string

	logger   *slog.Logger
	inFlight inflight.Tracker // calls running now, across reloads (console)
	pinMu    sync.Mutex       // the console's pins, one at a time
	cancel   context.CancelFunc
	done     chan struct{}
	stopKeys func() // ends a remote JWKS's refresh
	reloader        // what Reload keeps between generations
}

// Open builds every part cfg names. Close releases them.
func Open(ctx context.Context, cfg *config.Config, opts Options) (_ *App, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	a := &App{Config: cfg, logger: opts.Logger, done: make(chan struct{}), ReplicaID: replicaID(cfg.Server.ReplicaID)}
	defer func() {
		if err != nil {
			a.Close()
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
	a.HS256 = secret != nil
	a.SecretSource = source
	vopts := token.Options{Secret: secret, Audience: cfg.Auth.Audience}
	if cfg.Auth.JWKSFile != "" {
		if vopts.JWKS, err = os.ReadFile(cfg.Auth.JWKSFile); err != nil {
			return nil, fmt.Errorf("%s: auth.jwks_file: %w", cfg.Path, err)
		}
		if a.SecretSource != "" {
			a.SecretSource += " and "
		}
		a.SecretSource += "JWKS " + cfg.Auth.JWKSFile
	}
	// A remote JWKS is refreshed until Close.
	keysCtx, stopKeys := context.WithCancel(context.WithoutCancel(ctx))
	a.stopKeys = stopKeys
	if err := oidcOptions(keysCtx, cfg, &vopts, opts.Logger, &a.SecretSource); err != nil {
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
	verifier, err := token.NewVerifier(vopts)
	if err != nil {
		return nil, fmt.Errorf("%s: auth: %w", cfg.Path, err)
	}
	if a.Store, err = store.Open(ctx, cfg.Server.DataDir, store.Options{LookupEnv: opts.LookupEnv, URL: cfg.Store.URL}); err != nil {
		return nil, err
	}
	if a.Broker, err = Broker(cfg, a.Store, opts.Logger, opts.LookupEnv); err != nil {
		return nil, err
	}
	ao := auditOptions(cfg, opts.Logger)
	ao.Replica = a.ReplicaID           // every record says which replica wrote it
	ao.HeadKey = audit.HeadKey(secret) // nil without HS256: a key of this process's own would not outlive it
	if a.Audit, err = audit.Open(cfg.Audit.Path, ao); err != nil {
		return nil, err
	}
	a.reloader = reloader{verifier: verifier, master: master, lookupEnv: opts.LookupEnv}
	if a.Registry, err = sources.Build(ctx, a.registryOptions(cfg)); err != nil {
		return nil, err
	}
	if cfg.Server.MetricsListen != "" {
		// The registry of now: a reload swaps it (server.Swap).
		a.Metrics = telemetry.NewMetrics(telemetry.MetricsOptions{Sources: func() (int, int) { return a.Server.Registry().SourcesUp() },
			Sessions: func() int { return a.Server.MCP.Sessions() }})
	}
	if a.Tracer, err = telemetry.NewTracer(ctx, opts.LookupEnv, buildinfo.Version()); err != nil {
		return nil, err
	}
	if a.Router, err = a.newRouter(cfg, a.Registry, table); err != nil {
		return nil, err
	}
	issuer := ""
	if o := cfg.Auth.OIDC; o != nil {
		issuer = o.Issuer
	}
	a.Server = server.New(server.Options{Router: a.Router, Registry: a.Registry, Logger: opts.Logger,
		Listen: cfg.Server.Listen, Socket: cfg.Server.Socket, Issuer: issuer, Ready: a.ready, Secret: master,
		ReplicaID: a.ReplicaID, AdvertiseURL: cfg.Server.AdvertiseURL, ClaimOnce: a.claimOnce, Claimed: a.Store.Claimed,
		Metrics: a.Metrics, Tracer: a.Tracer, MetricsListen: cfg.Server.MetricsListen, Discovery: DiscoveryOf(cfg.Discovery),
		Sessions: server.SessionLimits{Idle: cfg.Server.SessionIdleTimeout.Std(), Max: cfg.Server.MaxSessions},
		Browser:  a.browser(),
		Limits: server.Limits{HeaderTimeout: cfg.Server.HeaderTimeout.Std(),
			MaxRequestBytes: int64(cfg.Server.MaxRequestBytes), DrainDelay: cfg.Server.DrainDelay.Std()}})
	if a.Console, err = a.newConsole(cfg, table); err != nil {
		return nil, err
	}
	if err := a.Server.LoadSkills(skills.Options{Installed: opts.SkillsDirs, Workspace: cfg.Dir}, SkillSettings(cfg.Skills)); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() {
		defer close(a.done)
		a.prune(runCtx)
	}()
	a.stopRun = run(a.Registry)
	return a, nil
}

// browser is what users' browsers open under /oauth/: the broker's links
// and callback, when there is a broker.
func (a *App) browser() http.Handler {
	if a.Broker == nil {
		return nil
	}
	return a.Broker.Handler()
}

// replicaID is the configured replica id, or <hostname>-<pid>: unique
// among replicas on several hosts and several processes on one.
func replicaID(configured string) string {
	if configured != "" {
		return configured
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "capgate"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// claimOnce is the store's ClaimOnce as the server takes it.
func (a *App) claimOnce(ctx context.Context, key string, expires time.Time) (bool, error) {
	err := a.Store.ClaimOnce(ctx, key, expires)
	if errors.Is(err, store.ErrExists) {
		return false, nil
	}
	return err == nil, err
}

// ready says whether the store answers and the audit log can record
// calls: what /readyz reports beyond the front door's own state.
func (a *App) ready(ctx context.Context) error {
	if err := a.Store.Ping(ctx); err != nil {
		return fmt.Errorf("the store does not answer: %w", err)
	}
	if err := a.Audit.Healthy(); err != nil {
		return fmt.Errorf("the audit log cannot record calls: %w", err)
	}
	return nil
}

// Close stops the sources, flushes the audit log and closes the store.
func (a *App) Close() error {
	var errs []error
	if a.stopKeys != nil {
		a.stopKeys()
	}
	a.reloadMu.Lock() // no reload half done
	defer a.reloadMu.Unlock()
	if a.stopRun != nil {
		a.stopRun()
		a.stopRun = nil
	}
	if a.cancel != nil {
		a.cancel()
		<-a.done
	}
	a.retireAll()
	if a.Registry != nil {
		errs = append(errs, a.Registry.Close())
	}
	if a.Tracer != nil {
		// The spans still buffered are sent, within a bound.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, a.Tracer.Shutdown(ctx))
		cancel()
	}
	if a.Audit != nil {
		errs = append(errs, a.Audit.Close())
	}
	if a.Store != nil {
		errs = append(errs, a.Store.Close())
	}
	return errors.Join(errs...)
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
func (a *App) prune(ctx context.Context) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.Store.Prune(ctx); err != nil && ctx.Err() == nil {
				a.logger.Warn("pruning the store failed", "err", err)
			}
		}
	}
}

// SkillSettings are skills' settings from the config's [skills.NAME]
// tables ([skills.defaults] among them).
func SkillSettings(cfg map[string]config.Skill) map[string]skills.Settings {
	out := make(map[string]skills.Settings, len(cfg))
	for name, c := range cfg {
		out[name] = skills.Settings{Enabled: c.Enabled, Model: c.Model, AllowChatIDs: slices.Clone(c.AllowChatIDs), Env: c.Env}
	}
	return out
}
