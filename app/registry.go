package app

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/server"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/sources/bridge"
	"github.com/capgate/capgate/sources/ext"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// LockPath is where the definition pins of a config live: capgate.lock
// beside it.
func LockPath(cfg *config.Config) string { return filepath.Join(cfg.Dir, registry.LockFile) }

// RegistryOptions are the registry's build options from the config: its
// extension packs, bridge providers and upstream MCP servers with the
// operator's overrides, and its lock. The caller sets BridgeKey, Logger
// and LookupEnv; LockPath = "" ignores the lock.
func RegistryOptions(cfg *config.Config) sources.BuildOptions {
	policy := SandboxPolicy(cfg)
	bo := sources.BuildOptions{
		ExtPaths: cfg.Extensions.Paths,
		Ext: ext.Options{
			Timeout: cfg.Extensions.Timeout.Std(), MaxOutput: int64(cfg.Extensions.MaxOutputBytes),
			Env: cfg.Extensions.Env, Policy: policy,
		},
		RequireLock: cfg.Policy.RequireLock,
		LockPath:    LockPath(cfg),
		Origin:      cfg.Path,
	}
	for _, p := range cfg.Providers() {
		if !p.IsEnabled() {
			continue
		}
		// One declaration for the provider's whole process.
		conf, notes := policy.For(string(tool.KindBridge)+":"+p.Namespace, declared(p.Capabilities))
		bo.Notes = append(bo.Notes, prefixed(p.Key, notes)...)
		bo.Bridges = append(bo.Bridges, sources.Bridge{Key: p.Key, Options: bridge.Options{
			Namespace: p.Namespace, Command: p.Command, Timeout: time.Duration(p.TimeoutSeconds) * time.Second,
			MaxOutput: int64(cfg.Capabilities.MaxOutputBytes), Env: p.Env, Confine: conf,
		}})
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.MCP.Servers)) {
		sc := cfg.MCP.Servers[name]
		var conf sandbox.Confinement
		if sc.Command != "" {
			var notes []string
			conf, notes = policy.For(string(tool.KindMCP)+":"+name, declared(sc.Capabilities))
			bo.Notes = append(bo.Notes, prefixed("mcp.servers."+name, notes)...)
		}
		s := sources.MCPServer{
			Key: "mcp.servers." + name,
			Options: mcp.Options{
				Name: name, Command: sc.Command, Args: sc.Args, Env: sc.Env, Cwd: sc.Cwd,
				URL: sc.URL, Transport: sc.Transport, Headers: sc.Headers, TrustAnnotations: sc.TrustAnnotations,
				Timeout: sc.Timeout.Std(), MaxMessage: int64(sc.MaxResultBytes), Confine: conf,
				Hooks: upstreamHooks,
			},
			Prefix:  *sc.Prefix,
			Default: override(sc.Risk, sc.SideEffects, config.ToolOverride{}),
			Tools:   map[string]registry.Override{},
		}
		for t, o := range sc.Tools {
			s.Tools[t] = override(o.Risk, o.SideEffects, o)
		}
		bo.MCP = append(bo.MCP, s)
	}
	return bo
}

func prefixed(key string, notes []string) []string {
	out := make([]string, len(notes))
	for i, n := range notes {
		out[i] = key + ": " + n
	}
	return out
}

// override turns config words (already validated by config) into an
// Override.
func override(level string, effects []string, o config.ToolOverride) registry.Override {
	out := registry.Override{Description: o.Description, Hidden: o.Hidden, Name: o.Name}
	if level != "" {
		out.Level, _ = risk.ParseLevel(level)
	}
	if effects != nil {
		out.Effects, _ = risk.ParseSideEffects(effects)
	}
	return out
}

// upstreamHooks serve each caller of a streamable-HTTP upstream at its own
// protocol revision, and a caller of 2025-11-25 on a session of its own,
// so that what the upstream sends there outside a call's stream
// (sampling on its standalone stream, log messages) reaches that caller.
var upstreamHooks = mcp.Hooks{
	Protocol: mcpserver.RequestProtocolVersion,
	SessionKey: func(ctx context.Context) string {
		if c := server.CallerFrom(ctx); c != nil {
			return c.Sub
		}
		return ""
	},
}
