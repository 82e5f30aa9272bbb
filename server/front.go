package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/internal/pidlock"
	"github.com/capgate/capgate/rpc"
)

// The front door is one net/http server for TCP and one for the Unix
// socket, with the same handler: every request passes the same admission
// middleware, in one order (recovery, the DNS-rebinding check, then per
// route the bearer token and the body limit), before /mcp's fast call,
// mcp-go or the capability RPC sees it.

// Limits of the front door. The header deadline is absolute (net/http
// sets it once per request), so a client trickling bytes cannot hold a
// connection past it. Bodies get their own deadline, set when a handler
// starts reading and cleared after, because a server-wide ReadTimeout
// would also end the long-lived streams of GET /mcp (httpadmit.ReadBody).
const (
	idleTimeout    = 2 * time.Minute
	maxHeaderBytes = 64 << 10
	// MaxRequestBytes bounds one request body on /mcp and /rpc unless
	// Limits say otherwise; a larger one gets 413 before capgate reads it.
	MaxRequestBytes = httpadmit.MaxRequestBytes
)

// Limits are the front door's bounds ([server] header_timeout and
// max_request_bytes); zero values take the defaults.
type Limits struct {
	HeaderTimeout   time.Duration // default 10s
	MaxRequestBytes int64         // default MaxRequestBytes
	// DrainDelay: after Serve's context ends, /readyz fails this long
	// while everything else is still served, then the listeners close.
	DrainDelay time.Duration
}

func (l Limits) headerTimeout() time.Duration {
	if l.HeaderTimeout > 0 {
		return l.HeaderTimeout
	}
	return 10 * time.Second
}

func (l Limits) maxRequestBytes() int64 {
	if l.MaxRequestBytes > 0 {
		return l.MaxRequestBytes
	}
	return MaxRequestBytes
}

// Handler serves MCP at /mcp (with its protected-resource metadata) and
// the capability RPC at /rpc.
func (s *Server) Handler() http.Handler { return s.handler(true) }

// handler is Handler, with the fast call or (fast false) every MCP request
// through mcp-go: the fast call's reference in tests.
func (s *Server) handler(fast bool) http.Handler {
	max := s.limits.maxRequestBytes()
	mux := http.NewServeMux()
	mux.Handle("/mcp", &bearerAuth{mcp: s.MCP, next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.MCP.serve(w, r, fast, max)
	})})
	mux.Handle(metadataPath, metadataHandler(s.issuer))
	mux.Handle("/.well-known/oauth-protected-resource", metadataHandler(s.issuer))
	mux.HandleFunc("/rpc", func(w http.ResponseWriter, r *http.Request) {
		(&rpc.Handler{Router: s.Router(), MaxBody: max, Search: s.MCP.rpcSearch, // the router of now (Swap)
			Metrics: s.MCP.metrics, Tracer: s.MCP.tracer, ExposedName: s.MCP.exposedName}).ServeHTTP(w, r)
	})
	mux.HandleFunc(internalPath, func(w http.ResponseWriter, r *http.Request) { s.MCP.serveInternal(w, r, max) })
	if s.browser != nil {
		mux.Handle("/oauth/", s.browser)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	return recoverPanics(s.logger, rejectRebinding(s.closeWhileDraining(mux)))
}

// closeWhileDraining ends each connection after its answer once the drain
// has begun, so that none is left idle when it ends. Idle ones are not
// closed at its start: a balancer that has not yet seen /readyz fail may
// be sending a request on one at that moment, and would lose it.
func (s *Server) closeWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// newHTTPServer is the front door's net/http server over h; busy, when
// not nil, counts its requests under way.
func (s *Server) newHTTPServer(h http.Handler, busy *inFlight) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.limits.headerTimeout(),
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
		ConnState:         busy.track,
	}
}

// Serve listens on the config's TCP address and Unix socket until ctx
// ends, then shuts down gracefully: in-flight requests get grace to
// finish. ready, when not nil, is called with the bound addresses.
func (s *Server) Serve(ctx context.Context, ready func(addr, socket string)) error {
	h := s.Handler()
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return err
	}
	listeners := []net.Listener{ln}
	socket := ""
	if s.socket != "-" {
		socket = s.socket
		// The socket is this serve's alone (a lock beside it): another
		// serve's live socket is never removed or taken over.
		held, err := pidlock.Acquire(socket + ".lock")
		if err != nil {
			ln.Close()
			return fmt.Errorf("rpc socket: %w", err)
		}
		defer held.Release()
		_ = os.Remove(socket) // a stale socket from a previous run
		uln, err := net.Listen("unix", socket)
		if err != nil {
			ln.Close()
			return fmt.Errorf("rpc socket: %w", err)
		}
		_ = os.Chmod(socket, 0o600)
		listeners = append(listeners, uln)
	}
	if s.metricsListen != "" && s.metrics != nil {
		mln, err := net.Listen("tcp", s.metricsListen)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("metrics listener: %w", err)
		}
		s.metricsAddr = mln.Addr().String()
		mctx, stopMetrics := context.WithCancel(ctx)
		defer stopMetrics()
		go s.serveMetrics(mctx, mln)
	}
	if ready != nil {
		ready(ln.Addr().String(), socket)
	}
	servers := make([]*http.Server, len(listeners))
	busy := newInFlight()
	errc := make(chan error, len(listeners))
	var wg sync.WaitGroup
	for i, l := range listeners {
		servers[i] = s.newHTTPServer(h, busy)
		wg.Go(func() {
			if err := servers[i].Serve(l); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	select {
	case <-ctx.Done():
		// Not ready from now on; still serving until the balancer has
		// seen it. Each connection closes after its next answer.
		s.draining.Store(true)
		if d := s.limits.DrainDelay; d > 0 {
			s.logger.Info("draining: /readyz fails, calls are still served", "for", d)
			select {
			case <-time.After(d):
			case err = <-errc:
			}
		}
	case err = <-errc:
	}
	// No new connections; the requests under way get up to 10 s to be
	// answered. serve stops the moment the last one is: net/http's
	// Shutdown would look for that every 500 ms only.
	for _, l := range listeners {
		_ = l.Close()
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	busy.wait(shut)
	for _, srv := range servers {
		_ = srv.Close()
	}
	wg.Wait()
	if socket != "" {
		_ = os.Remove(socket)
	}
	return err
}

// MetricsAddr is the address GET /metrics is served on, once Serve has
// bound it; "" when there is none.
func (s *Server) MetricsAddr() string { return s.metricsAddr }

// recoverPanics answers a request whose handler panicked with 500 and logs
// the panic, so one bad request costs its own connection at most. A tool
// that panics is caught earlier, by the router, which audits it.
func recoverPanics(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil || p == http.ErrAbortHandler {
				if p != nil {
					panic(p)
				}
				return
			}
			logger.Error("http handler panicked", "method", r.Method, "path", r.URL.Path,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			http.Error(w, "500 internal error", http.StatusInternalServerError)
		}()
		next.ServeHTTP(w, r)
	})
}

// rejectRebinding refuses, as mcp-go does, a request that came in on a
// loopback address naming another host: a web page whose DNS name was
// rebound to 127.0.0.1 must not reach a local capgate. Health probes get
// two more Hosts no browser page can send: none at all (HTTP/1.0, as
// haproxy checks by default) and an address of this machine (an IP
// literal names no DNS name to rebind). Every other route stays strict.
func rejectRebinding(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && localLoopback(a) && !isLoopback(r.Host) &&
			!(isProbe(r) && (r.Host == "" || ownAddress(r.Host))) {
			http.Error(w, fmt.Sprintf("Forbidden: invalid Host header %q", r.Host), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isProbe says whether r asks /healthz or /readyz, which answer nothing
// but ok or not.
func isProbe(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

// ownAddress says whether host (a host, or host:port) is an IP address of
// one of this machine's interfaces.
func ownAddress(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	ip = ip.Unmap().WithZone("")
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if own, ok := netip.AddrFromSlice(n.IP); ok && own.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

// readyz answers 200 when this capgate can serve calls: not draining, its
// catalog loaded, and what Options.Ready checks (store, audit log); else
// 503 naming what is wrong. It needs no token: balancers ask it.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var why string
	switch {
	case s.draining.Load():
		why = "draining: shutting down"
	case s.Registry().Snapshot() == nil:
		why = "the catalog is not loaded yet"
	case s.ready != nil:
		if err := s.ready(ctx); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		http.Error(w, "503 not ready: "+why, http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ready\n")
}
