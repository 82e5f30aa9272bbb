// Package server is capgate's front door: it serves a router's capability
// RPC and MCP endpoint over HTTP and a Unix socket. Package app builds the
// parts from the config.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/h1"
	"github.com/capgate/capgate/internal/rawconn"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
)

// Options are the parts a Server fronts, built by the wiring (package app).
type Options struct {
	Router   *router.Router
	Registry *registry.Registry
	Logger   *slog.Logger
	// Listen is Serve's TCP address; Socket its Unix socket for the RPC,
	// "-" for none.
	Listen, Socket string
}

// Server is capgate's front door over a router and its registry.
type Server struct {
	Router   *router.Router
	Registry *registry.Registry
	MCP      *MCP

	logger         *slog.Logger
	auth           *bearerAuth // guards /mcp, for net/http and the h1 loop alike
	listen, socket string
}

// New makes the front door over opts' router and registry.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{Router: opts.Router, Registry: opts.Registry, logger: opts.Logger, listen: opts.Listen, socket: opts.Socket}
	s.MCP = NewMCP(s.Router, s.Registry)
	s.auth = &bearerAuth{router: s.Router, stream: s.MCP.stream, mcp: s.MCP}
	return s
}

// Handler serves MCP at /mcp (with its protected-resource metadata) and
// the capability RPC at /rpc.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.auth)
	mux.Handle(metadataPath, metadataHandler())
	mux.Handle("/.well-known/oauth-protected-resource", metadataHandler())
	mux.Handle("/rpc", &RPC{Router: s.Router})
	return mux
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

// Serve listens on the config's TCP address and Unix socket until ctx
// ends, then shuts down gracefully: in-flight requests get grace to
// finish. ready, when not nil, is called with the bound addresses.
//
// On TCP, capgate's own HTTP/1.1 loop (internal/h1) serves /mcp and hands
// every other connection to net/http; socket reads and writes are raw
// system calls (internal/rawconn). Both spare the thread wake-ups that
// cost more than a tool call's routing.
func (s *Server) Serve(ctx context.Context, ready func(addr, socket string)) error {
	h := s.Handler()
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return err
	}
	front := &h1.Server{
		Match: func(method, path string) bool {
			return path == "/mcp" && (method == http.MethodPost || method == http.MethodGet || method == http.MethodDelete)
		},
		Handler:  s.auth.serveH1,
		Fallback: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
	}
	type server struct {
		serve    func() error
		shutdown func(context.Context) error
	}
	servers := []server{{func() error { return front.Serve(ln) }, func(ctx context.Context) error {
		ln.Close()
		return front.Shutdown(ctx)
	}}}
	socket := ""
	if s.socket != "-" {
		socket = s.socket
		_ = os.Remove(socket) // a stale socket from a previous run
		uln, err := net.Listen("unix", socket)
		if err != nil {
			ln.Close()
			return fmt.Errorf("rpc socket: %w", err)
		}
		_ = os.Chmod(socket, 0o600)
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, server{func() error { return hs.Serve(rawconn.Listener{Listener: uln}) }, hs.Shutdown})
	}
	if ready != nil {
		ready(ln.Addr().String(), socket)
	}
	errc := make(chan error, len(servers))
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(func() {
			if err := srv.serve(); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.shutdown(shut)
	}
	wg.Wait()
	if socket != "" {
		_ = os.Remove(socket)
	}
	return err
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
	enabled, problems := skills.Apply(set, settings)
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
