// Package server is capgate's front door: it serves a router's MCP
// endpoint and capability RPC (package rpc, mounted at /rpc) over HTTP and
// a Unix socket. Package app builds the parts from the config.
package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/toolsearch"
)

// Options are the parts a Server fronts, built by the wiring (package app).
type Options struct {
	Router   *router.Router
	Registry *registry.Registry
	Logger   *slog.Logger
	// Listen is Serve's TCP address; Socket its Unix socket for the RPC,
	// "-" for none.
	Listen, Socket string
	// Limits bound the front door's requests.
	Limits Limits
	// Issuer is the OIDC issuer the protected-resource metadata names as
	// the authorization server; "" names none.
	Issuer string
	// Ready says whether the parts behind the router can serve calls (the
	// store answers, the audit log writes); /readyz asks it. nil: ready.
	Ready func(context.Context) error
	// Secret is the key material every replica shares (the token secret):
	// session ids are keyed from it, so that any replica accepts a session
	// another opened. nil: a key of this process's own.
	Secret []byte
	// ReplicaID names this replica in the request states it seals, and
	// AdvertiseURL is where other replicas reach it ("" for nowhere).
	ReplicaID, AdvertiseURL string
	// ClaimOnce records a request state as used, in the store the
	// replicas share; nil: claims hold in this process only.
	ClaimOnce ClaimFunc
	// Claimed says whether a key is claimed there: with ClaimOnce, a
	// session ended by its client's DELETE ends on every replica
	// (ended.go). nil: ends hold in this process only.
	Claimed ClaimedFunc
	// Metrics and Tracer observe every MCP request (nil: off); with
	// MetricsListen, Serve serves GET /metrics there, without a token.
	Metrics       *telemetry.Metrics
	Tracer        *telemetry.Tracer
	MetricsListen string
	// Browser serves what users' browsers open under /oauth/ (the sign-in
	// links and callback of upstream accounts, package upstreamauth),
	// without a capgate token; nil: nothing there.
	Browser http.Handler
	// Discovery is how callers find tools ([discovery]); the zero value
	// lists every tool.
	Discovery toolsearch.Discovery
	// Sessions bound the MCP sessions held ([server]
	// session_idle_timeout, max_sessions); zero values take the defaults.
	Sessions SessionLimits
}

// Server is capgate's front door over a router and its registry.
type Server struct {
	MCP *MCP // its router and registry: Router, Registry

	logger         *slog.Logger
	listen, socket string
	limits         Limits
	issuer         string
	ready          func(context.Context) error
	draining       atomic.Bool // /readyz fails: Serve is shutting down
	metrics        *telemetry.Metrics
	metricsListen  string
	metricsAddr    string // bound by Serve
	browser        http.Handler
}

// New makes the front door over opts' router and registry.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{logger: opts.Logger, listen: opts.Listen, socket: opts.Socket,
		limits: opts.Limits, issuer: opts.Issuer, ready: opts.Ready, metrics: opts.Metrics, metricsListen: opts.MetricsListen,
		browser: opts.Browser}
	secret := opts.Secret
	if secret == nil {
		secret = randomSecret()
	}
	s.MCP = NewMCP(opts.Router, opts.Registry, secret)
	s.MCP.internal.logger = opts.Logger
	s.MCP.jobs.sealer = newStateSealer(secret, opts.ReplicaID, opts.AdvertiseURL, opts.ClaimOnce)
	s.MCP.streams.replica, s.MCP.streams.url = opts.ReplicaID, opts.AdvertiseURL
	if opts.ClaimOnce != nil && opts.Claimed != nil {
		s.MCP.ends.shared(opts.ClaimOnce, opts.Claimed)
	}
	s.MCP.metrics, s.MCP.tracer = opts.Metrics, opts.Tracer
	s.MCP.SetDiscovery(opts.Discovery)
	s.MCP.live.limit(opts.Sessions, s.MCP.forget)
	return s
}

// ServeStdio serves one MCP client over in and out as the caller whose
// token is raw (or the anonymous caller), until ctx ends or in closes.
func (s *Server) ServeStdio(ctx context.Context, raw string, in io.Reader, out io.Writer) error {
	c, err := s.Router().Authenticate(raw)
	if err != nil {
		return err
	}
	stdio := mcpserver.NewStdioServer(s.MCP.Server())
	stdio.SetContextFunc(func(ctx context.Context) context.Context { return WithCaller(ctx, c) })
	return stdio.Listen(ctx, in, out)
}

// LoadSkills finds the skills (installed in o.Installed, user
// ~/.capgate/skills, workspace o.Workspace/skills, later overriding
// earlier), applies the operator's settings and serves the enabled ones.
// A skill that cannot be used is logged and explained to whoever asks
// for it.
func (s *Server) LoadSkills(o skills.Options, settings map[string]skills.Settings) error {
	set, err := skills.Discover(o)
	if err != nil {
		return fmt.Errorf("skills: %w", err)
	}
	s.SetSkills(set, settings)
	return nil
}

// SetSkills serves the skills of set that settings enable, in place of
// those served before (LoadSkills; a reload).
func (s *Server) SetSkills(set *skills.Set, settings map[string]skills.Settings) {
	enabled, problems := skills.Apply(set, settings)
	why := map[string]string{}
	for _, p := range append(set.Problems, problems...) {
		s.logger.Warn("skill not usable", "skill", p.Name, "source", p.Source, "path", p.Path, "err", p.Error())
		if p.Name != "" && !slices.ContainsFunc(enabled, func(e *skills.Skill) bool { return e.Name == p.Name }) {
			why[p.Name] = p.Error()
		}
	}
	s.MCP.SetSkills(enabled, why)
}
