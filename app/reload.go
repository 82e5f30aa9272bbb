package app

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/token"
)

// drainFor bounds how long a replaced registry waits for its calls before
// its sources close: the router's default call timeout, and a margin.
const drainFor = 2*time.Minute + 10*time.Second

// reloader is what Reload keeps between generations: the token keys
// (which a reload does not change) and the registries it replaced, still
// finishing their calls.
type reloader struct {
	verifier  *token.Verifier
	master    []byte
	lookupEnv func(string) (string, bool)

	reloadMu sync.Mutex // one reload at a time, and none during Close
	stopRun  func()     // ends the current registry's refresh loop
	retiring sync.WaitGroup
	retire   context.CancelFunc // cuts the drains short (Close)
	retireCx context.Context
}

// registryOptions are cfg's registry build options with this process's
// bridge keys, logger and environment.
func (a *App) registryOptions(cfg *config.Config) sources.BuildOptions {
	bo := RegistryOptions(cfg)
	master := a.master
	bo.BridgeKey = func(ns string) ([]byte, error) { return token.BridgeKey(master, ns) }
	bo.Logger, bo.LookupEnv = a.logger, a.lookupEnv
	WithAuth(&bo, a.Broker, func() *registry.Registry {
		if a.Server != nil {
			return a.Server.Registry()
		}
		return a.Registry
	})
	return bo
}

// newRouter is cfg's router over reg, with the running store, audit log,
// keys and telemetry: what Open builds first and every reload again.
func (a *App) newRouter(cfg *config.Config, reg *registry.Registry, table *risk.Table) (*router.Router, error) {
	// With a shared store, the rate limit is one budget across replicas.
	var buckets router.RateBuckets
	if a.Store.Shared() {
		buckets = a.Store
	}
	rt, err := router.New(router.Options{
		Registry: reg, Verifier: a.verifier, Risk: table, Policy: Policy(cfg),
		State: a.Store, Audit: a.Audit, Secret: a.master, Logger: a.logger,
		RateBuckets: buckets, Metrics: routerMetrics(a.Metrics), Tracer: routerTracer(a.Tracer, cfg),
		InFlight:         &a.inFlight,
		ApprovalWait:     cfg.Policy.ApprovalWait.Std(),
		IdempotencyLease: cfg.Idempotency.Lease.Std(), IdempotencyWait: cfg.Idempotency.Wait.Std(),
		Repeatable: cfg.Idempotency.Repeatable,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	return rt, nil
}

// run refreshes reg's catalog until the returned stop is called; stop
// waits for the loop to end.
func run(reg *registry.Registry) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.Run(ctx)
	}()
	return func() { cancel(); <-done }
}

// Reload rebuilds the policy, grants, sources, overrides and skills from
// cfg and swaps them in at the front door's one swap point (server.Swap).
// Sessions stay; calls already running finish on the registry they began
// on, whose sources close once those calls are done. What cannot change
// while serving (restartOnly: listeners, data dir, audit log, token keys,
// anonymous access) keeps its running value and is returned as needing a restart. On error
// nothing changed: the running config keeps serving.
//
// skillsDirs are the installed skill directories, as for Open.
func (a *App) Reload(ctx context.Context, cfg *config.Config, skillsDirs []string) (needsRestart []string, err error) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if a.stopRun == nil {
		return nil, errors.New("capgate is closed")
	}
	needsRestart = NeedsRestart(a.Config, cfg)
	cfg = keepRunning(a.Config, cfg)
	table, err := RiskTable(cfg.Policy.RiskFile)
	if err != nil {
		return nil, err
	}
	// The broker first: the sources' auth hooks are set for the servers
	// it has.
	prevAuth, _ := authServers(a.Config, a.lookupEnv)
	if err := a.reloadBroker(cfg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && a.Broker != nil {
			a.Broker.Reconfigure(prevAuth) // nothing changed
		}
	}()
	reg, err := sources.Build(ctx, a.registryOptions(cfg))
	if err != nil {
		return nil, err
	}
	// The store, audit log and keys are the running ones: only what the
	// config's policy and sources say is new.
	rt, err := a.newRouter(cfg, reg, table)
	if err != nil {
		reg.Close()
		return nil, err
	}
	set, err := skills.Discover(skills.Options{Installed: skillsDirs, Workspace: cfg.Dir})
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("skills: %w", err)
	}
	_, oldReg := a.Server.Swap(rt, reg)
	a.Server.SetSkills(set, SkillSettings(cfg.Skills))
	a.Server.MCP.SetDiscovery(DiscoveryOf(cfg.Discovery))
	a.stopRun()
	a.stopRun = run(reg)
	a.Router, a.Registry = rt, reg
	a.retireLater(oldReg)
	return needsRestart, nil
}

// retireLater closes reg once its running calls are done (or drainFor
// passed, or Close cut it short).
func (a *App) retireLater(reg *registry.Registry) {
	if a.retireCx == nil {
		a.retireCx, a.retire = context.WithCancel(context.Background())
	}
	a.retiring.Go(func() {
		ctx, cancel := context.WithTimeout(a.retireCx, drainFor)
		defer cancel()
		if err := reg.Drain(ctx); err != nil {
			a.logger.Warn("reload: closing the replaced sources with calls still running", "err", err)
		}
		if err := reg.Close(); err != nil {
			a.logger.Warn("reload: closing the replaced sources", "err", err)
		}
	})
}

// retireAll closes the registries reloads replaced, at once.
func (a *App) retireAll() {
	if a.retire != nil {
		a.retire()
	}
	a.retiring.Wait()
}

// restartOnly is every key only a restart applies, each with where it
// lives in a Config: the listeners, the data dir (the store, and the paths
// the sandbox keeps tools from), the audit log, and who may call at all
// (token keys, anonymous access). A reload keeps their running values.
var restartOnly = []struct {
	key   string
	field func(*config.Config) any // a pointer to the field
}{
	{"server.listen", func(c *config.Config) any { return &c.Server.Listen }},
	{"server.data_dir", func(c *config.Config) any { return &c.Server.DataDir }},
	{"server.socket", func(c *config.Config) any { return &c.Server.Socket }},
	{"server.header_timeout", func(c *config.Config) any { return &c.Server.HeaderTimeout }},
	{"server.max_request_bytes", func(c *config.Config) any { return &c.Server.MaxRequestBytes }},
	{"server.drain_delay", func(c *config.Config) any { return &c.Server.DrainDelay }},
	{"server.replica_id", func(c *config.Config) any { return &c.Server.ReplicaID }},
	{"server.public_url", func(c *config.Config) any { return &c.Server.PublicURL }},
	{"server.advertise_url", func(c *config.Config) any { return &c.Server.AdvertiseURL }},
	{"server.metrics_listen", func(c *config.Config) any { return &c.Server.MetricsListen }},
	{"server.session_idle_timeout", func(c *config.Config) any { return &c.Server.SessionIdleTimeout }},
	{"server.max_sessions", func(c *config.Config) any { return &c.Server.MaxSessions }},
	{"store", func(c *config.Config) any { return &c.Store }},
	{"console", func(c *config.Config) any { return &c.Console }},
	{"audit", func(c *config.Config) any { return &c.Audit }},
	{"auth.secret_env", func(c *config.Config) any { return &c.Auth.SecretEnv }},
	{"auth.audience", func(c *config.Config) any { return &c.Auth.Audience }},
	{"auth.jwks_file", func(c *config.Config) any { return &c.Auth.JWKSFile }},
	{"auth.jwks_url", func(c *config.Config) any { return &c.Auth.JWKSURL }},
	{"auth.oidc", func(c *config.Config) any { return &c.Auth.OIDC }},
	{"auth.allow_hs256", func(c *config.Config) any { return &c.Auth.AllowHS256 }},
	{"auth.anonymous", func(c *config.Config) any { return &c.Auth.Anonymous }},
}

// NeedsRestart names the restartOnly keys whose value differs between
// running and next.
func NeedsRestart(running, next *config.Config) []string {
	var out []string
	for _, k := range restartOnly {
		if !reflect.DeepEqual(k.field(running), k.field(next)) {
			out = append(out, k.key)
		}
	}
	return out
}

// keepRunning is next with every restartOnly key set to its running
// value: what a reload may apply.
func keepRunning(running, next *config.Config) *config.Config {
	c := *next
	for _, k := range restartOnly {
		reflect.ValueOf(k.field(&c)).Elem().Set(reflect.ValueOf(k.field(running)).Elem())
	}
	return &c
}
