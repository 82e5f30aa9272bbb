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
func (a *App) registryOptions(cfg *config.Config) registry.BuildOptions {
	bo := RegistryOptions(cfg)
	master := a.master
	bo.BridgeKey = func(ns string) ([]byte, error) { return token.BridgeKey(master, ns) }
	bo.Logger, bo.LookupEnv = a.logger, a.lookupEnv
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
		RateBuckets: buckets, Metrics: a.Metrics, Tracer: a.Tracer,
		ApprovalWait: cfg.Policy.ApprovalWait.Std(),
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
// while serving (listen address, socket, data dir, audit log, token keys)
// keeps its running value and is returned as needing a restart. On error
// nothing changed: the running config keeps serving.
//
// skillsDirs are the installed skill directories, as for Open.
func (a *App) Reload(ctx context.Context, cfg *config.Config, skillsDirs []string) (needsRestart []string, err error) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if a.stopRun == nil {
		return nil, errors.New("capgate is closed")
	}
	table, err := RiskTable(cfg.Policy.RiskFile)
	if err != nil {
		return nil, err
	}
	reg, err := registry.Build(ctx, a.registryOptions(cfg))
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
	a.stopRun()
	a.stopRun = run(reg)
	a.Router, a.Registry = rt, reg
	a.retireLater(oldReg)
	return NeedsRestart(a.Config, cfg), nil
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

// NeedsRestart names the keys whose change between running and next only
// a restart applies: the listeners, the data dir (the store), the audit
// log and the token keys.
func NeedsRestart(running, next *config.Config) []string {
	r, n := running.Server, next.Server
	var out []string
	for _, k := range []struct {
		key  string
		a, b any
	}{
		{"server.listen", r.Listen, n.Listen},
		{"server.data_dir", r.DataDir, n.DataDir},
		{"server.socket", r.Socket, n.Socket},
		{"server.header_timeout", r.HeaderTimeout, n.HeaderTimeout},
		{"server.max_request_bytes", r.MaxRequestBytes, n.MaxRequestBytes},
		{"server.drain_delay", r.DrainDelay, n.DrainDelay},
		{"server.replica_id", r.ReplicaID, n.ReplicaID},
		{"server.advertise_url", r.AdvertiseURL, n.AdvertiseURL},
		{"server.metrics_listen", r.MetricsListen, n.MetricsListen},
		{"store", running.Store, next.Store},
		{"console", running.Console, next.Console},
		{"audit", running.Audit, next.Audit},
		{"auth.secret_env", running.Auth.SecretEnv, next.Auth.SecretEnv},
		{"auth.audience", running.Auth.Audience, next.Auth.Audience},
		{"auth.jwks_file", running.Auth.JWKSFile, next.Auth.JWKSFile},
		{"auth.jwks_url", running.Auth.JWKSURL, next.Auth.JWKSURL},
		{"auth.oidc", running.Auth.OIDC, next.Auth.OIDC},
		{"auth.allow_hs256", running.Auth.AllowHS256, next.Auth.AllowHS256},
	} {
		if !reflect.DeepEqual(k.a, k.b) {
			out = append(out, k.key)
		}
	}
	return out
}
