package registry

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources/bridge"
	"github.com/capgate/capgate/sources/ext"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// BuildOptions are what Build needs beyond the config.
type BuildOptions struct {
	// BridgeKey gives a bridge provider its own context-token key (capgate
	// derives one per namespace; never its own key). Nil gives each
	// provider a random key, for builds that only list tools.
	BridgeKey func(namespace string) ([]byte, error)
	Logger    *slog.Logger
	LookupEnv func(string) (string, bool)
	// IgnoreLock builds the catalog without quarantining anything, for
	// writing a new lock.
	IgnoreLock bool
}

// LockPath is where the definition pins of a config live: capgate.lock
// beside it.
func LockPath(cfg *config.Config) string { return filepath.Join(cfg.Dir, LockFile) }

// Build starts the sources cfg names (extension packs, bridge providers,
// upstream MCP servers, connected concurrently) and returns the registry
// over them. An upstream that cannot be reached at start is not an error:
// it is retried in the background and its tools appear when it answers.
func Build(ctx context.Context, cfg *config.Config, bo BuildOptions) (*Registry, error) {
	if bo.Logger == nil {
		bo.Logger = slog.New(slog.DiscardHandler)
	}
	if bo.LookupEnv == nil {
		bo.LookupEnv = os.LookupEnv
	}
	var sources []tool.Source
	if len(cfg.Extensions.Paths) > 0 {
		packs, err := ext.Discover(cfg.Extensions.Paths, ext.Options{
			Timeout: cfg.Extensions.Timeout.Std(), MaxOutput: int64(cfg.Extensions.MaxOutputBytes),
			Env: cfg.Extensions.Env, LookupEnv: bo.LookupEnv, Logger: bo.Logger,
		})
		if err != nil {
			return nil, err
		}
		for _, p := range packs {
			sources = append(sources, p)
		}
	}
	if bo.BridgeKey == nil {
		bo.BridgeKey = randomKey
	}
	for _, p := range cfg.Providers() {
		if !p.IsEnabled() {
			continue
		}
		key, err := bo.BridgeKey(p.Namespace)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", cfg.Path, p.Key, err)
		}
		b, err := bridge.New(bridge.Options{
			Namespace: p.Namespace, Command: p.Command, Timeout: time.Duration(p.TimeoutSeconds) * time.Second,
			MaxOutput: int64(cfg.Capabilities.MaxOutputBytes), Secret: key, Env: p.Env, LookupEnv: bo.LookupEnv,
			Logger: bo.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", cfg.Path, p.Key, err)
		}
		sources = append(sources, b)
	}
	opts := Options{
		Prefixes:    map[string]string{},
		Defaults:    map[string]Override{},
		Overrides:   map[string]Override{},
		RequireLock: cfg.Policy.RequireLock,
		Logger:      bo.Logger,
	}
	var upstreams []*mcp.Source
	for _, name := range slices.Sorted(maps.Keys(cfg.MCP.Servers)) {
		sc := cfg.MCP.Servers[name]
		src, err := mcp.New(mcp.Options{
			Name: name, Command: sc.Command, Args: sc.Args, Env: sc.Env, Cwd: sc.Cwd,
			URL: sc.URL, Transport: sc.Transport, Headers: sc.Headers, TrustAnnotations: sc.TrustAnnotations,
			Timeout: sc.Timeout.Std(), MaxMessage: int64(sc.MaxResultBytes), Logger: bo.Logger, LookupEnv: bo.LookupEnv,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: mcp.servers.%s: %w", cfg.Path, name, err)
		}
		upstreams = append(upstreams, src)
		sources = append(sources, src)
		key := string(tool.KindMCP) + ":" + name
		opts.Prefixes[key] = *sc.Prefix
		opts.Defaults[key] = override(sc.Risk, sc.SideEffects, config.ToolOverride{})
		for t, o := range sc.Tools {
			opts.Overrides[tool.ID(tool.KindMCP, name, t)] = override(o.Risk, o.SideEffects, o)
		}
	}
	var wg sync.WaitGroup
	for _, u := range upstreams {
		wg.Go(func() {
			if err := u.Connect(ctx); err != nil {
				bo.Logger.Warn("upstream MCP server not reachable at start; retrying in the background", "server", u.ID(), "err", err)
			}
		})
	}
	wg.Wait()
	if !bo.IgnoreLock {
		lock, err := ReadLock(LockPath(cfg))
		if err != nil {
			return nil, err
		}
		opts.Lock = lock
	}
	r, err := New(ctx, sources, opts)
	if err != nil {
		for _, u := range upstreams {
			u.Close()
		}
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	return r, nil
}

// override turns config words (already validated by config) into an
// Override.
func override(level string, effects []string, o config.ToolOverride) Override {
	out := Override{Description: o.Description, Hidden: o.Hidden, Name: o.Name}
	if level != "" {
		out.Level, _ = risk.ParseLevel(level)
	}
	if effects != nil {
		out.Effects, _ = risk.ParseSideEffects(effects)
	}
	return out
}

// randomKey is a bridge key no token capgate signs will verify with.
func randomKey(string) ([]byte, error) {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	return k, err
}
