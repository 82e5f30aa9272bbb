// Package sources starts the three kinds of tool source (extension packs,
// bridge providers, upstream MCP servers) a config names and builds the
// registry over them. It is the one place that knows the kinds: registry
// and router see only tool.Source.
package sources

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/sources/bridge"
	"github.com/capgate/capgate/sources/ext"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// BuildOptions are the sources Build starts, each with its own package's
// options, and what the registry over them needs.
type BuildOptions struct {
	// ExtPaths are directories of extension packs, discovered with Ext.
	ExtPaths []string
	Ext      ext.Options
	Bridges  []Bridge
	MCP      []MCPServer
	// BridgeKey gives a bridge provider its own context-token key (capgate
	// derives one per namespace; never its own key). Nil gives each
	// provider a random key, for builds that only list tools.
	BridgeKey func(namespace string) ([]byte, error)
	// RequireLock quarantines tools the lock does not pin.
	RequireLock bool
	// LockPath is the definition pins' file; "" builds the catalog
	// without quarantining anything, for writing a new lock.
	LockPath string
	// Origin names what the sources came from (the config's path) in
	// errors.
	Origin string
	// Notes are what the config asked that was not applied (an override
	// that would loosen a guarantee); Build logs each.
	Notes []string
	// Logger and LookupEnv are the default of every source's own.
	Logger    *slog.Logger
	LookupEnv func(string) (string, bool)
}

// Bridge is one bridge provider to start. Its Secret is BridgeKey's.
type Bridge struct {
	Key string // where it was configured, for errors
	bridge.Options
}

// MCPServer is one upstream MCP server to connect, with the operator's
// words on its tools.
type MCPServer struct {
	Key string // where it was configured, for errors
	mcp.Options
	// Prefix of its tools' exposed names ("" none).
	Prefix string
	// Default applies to every tool of the server; Tools, by the
	// upstream's tool name, to one.
	Default registry.Override
	Tools   map[string]registry.Override
}

// Build starts the sources bo names (extension packs, bridge providers,
// upstream MCP servers, connected concurrently) and returns the registry
// over them. An upstream that cannot be reached at start is not an error:
// it is retried in the background and its tools appear when it answers.
func Build(ctx context.Context, bo BuildOptions) (*registry.Registry, error) {
	if bo.Logger == nil {
		bo.Logger = slog.New(slog.DiscardHandler)
	}
	if bo.LookupEnv == nil {
		bo.LookupEnv = os.LookupEnv
	}
	for _, n := range bo.Notes {
		bo.Logger.Warn("capability override ignored", "origin", bo.Origin, "note", n)
	}
	// The lock first: a process whose launch loosened since it was pinned
	// is never started (refuse).
	var lock *registry.Lock
	if bo.LockPath != "" {
		var err error
		if lock, err = registry.ReadLock(bo.LockPath); err != nil {
			return nil, err
		}
	}
	var sources []tool.Source
	if len(bo.ExtPaths) > 0 {
		eo := bo.Ext
		eo.Logger = cmp.Or(eo.Logger, bo.Logger)
		if eo.LookupEnv == nil {
			eo.LookupEnv = bo.LookupEnv
		}
		packs, err := ext.Discover(bo.ExtPaths, eo)
		if err != nil {
			return nil, err
		}
		for _, p := range packs {
			p.Hold(func(name string) []sandbox.Launch { return lock.Launches(tool.KindExt, p.ID(), name) }, bo.Logger.Warn)
			sources = append(sources, p)
		}
	}
	if bo.BridgeKey == nil {
		bo.BridgeKey = randomKey
	}
	for _, p := range bo.Bridges {
		o := p.Options
		o.Logger = cmp.Or(o.Logger, bo.Logger)
		if o.LookupEnv == nil {
			o.LookupEnv = bo.LookupEnv
		}
		key, err := bo.BridgeKey(o.Namespace)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", bo.Origin, p.Key, err)
		}
		o.Secret = key
		o.Confine.Held = sandbox.Hold(string(tool.KindBridge)+":"+o.Namespace, o.Command, "", bo.Logger.Warn,
			lock.Launches(tool.KindBridge, o.Namespace, "")...)
		b, err := bridge.New(o)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", bo.Origin, p.Key, err)
		}
		if r := refuse(lock, tool.KindBridge, b.ID(), b.Launch(), o.Confine.Describe(), bo.Logger.Warn); r != nil {
			sources = append(sources, r)
			continue
		}
		sources = append(sources, b)
	}
	opts := registry.Options{
		Prefixes:    map[string]string{},
		Defaults:    map[string]registry.Override{},
		Overrides:   map[string]registry.Override{},
		RequireLock: bo.RequireLock,
		Logger:      bo.Logger,
		Lock:        lock,
	}
	var upstreams []*mcp.Source
	for _, sc := range bo.MCP {
		o := sc.Options
		o.Logger = cmp.Or(o.Logger, bo.Logger)
		if o.LookupEnv == nil {
			o.LookupEnv = bo.LookupEnv
		}
		if o.Command != "" {
			o.Confine.Held = sandbox.Hold(string(tool.KindMCP)+":"+o.Name, append([]string{o.Command}, o.Args...), o.Cwd, bo.Logger.Warn,
				lock.Launches(tool.KindMCP, o.Name, "")...)
		}
		src, err := mcp.New(o)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", bo.Origin, sc.Key, err)
		}
		if r := refuse(lock, tool.KindMCP, src.ID(), src.Launch(), o.Confine.Describe(), bo.Logger.Warn); r != nil {
			src.Close() // never connected: ends what New began
			sources = append(sources, r)
		} else {
			upstreams = append(upstreams, src)
			sources = append(sources, src)
		}
		key := string(tool.KindMCP) + ":" + o.Name
		opts.Prefixes[key] = sc.Prefix
		opts.Defaults[key] = sc.Default
		for t, ov := range sc.Tools {
			opts.Overrides[tool.ID(tool.KindMCP, o.Name, t)] = ov
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
	r, err := registry.New(ctx, sources, opts)
	if err != nil {
		for _, u := range upstreams {
			u.Close()
		}
		return nil, fmt.Errorf("%s: %w", bo.Origin, err)
	}
	return r, nil
}

// randomKey is a bridge key no token capgate signs will verify with.
func randomKey(string) ([]byte, error) {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	return k, err
}
