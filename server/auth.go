package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/h1"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// metadataPath is where the RFC 9728 protected-resource metadata of /mcp
// lives.
const metadataPath = "/.well-known/oauth-protected-resource/mcp"

// bearerAuth verifies the bearer token of every request before next sees
// it, and puts the caller in the request's context. A missing or bad token
// gets 401 with WWW-Authenticate pointing at the metadata document. A
// session belongs to the subject that opened it.
type bearerAuth struct {
	router   *router.Router
	stream   *mcpserver.StreamableHTTPServer
	mcp      *MCP
	sessions sync.Map // Mcp-Session-Id → sub
}

func (a *bearerAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, ok := a.admit(w, r.Host, r.Header)
	if !ok {
		return
	}
	a.stream.ServeHTTP(&sessionRecorder{ResponseWriter: w, auth: a, sub: c.Sub}, r.WithContext(WithCaller(r.Context(), c)))
}

// serveH1 serves an MCP request that capgate's own HTTP/1.1 loop read:
// the same checks as ServeHTTP, mcp-go's DNS-rebinding check included,
// then mcp-go's transport-neutral entry point.
func (a *bearerAuth) serveH1(w *h1.ResponseWriter, r *h1.Request) {
	if localLoopback(r.LocalAddr) && !isLoopback(r.Host) {
		http.Error(w, fmt.Sprintf("Forbidden: invalid Host header %q", r.Host), http.StatusForbidden)
		return
	}
	c, ok := a.admit(w, r.Host, r)
	if !ok || a.mcp.fastCall(w, c, r) {
		return
	}
	a.stream.Handle(&sessionRecorder{ResponseWriter: w, auth: a, sub: c.Sub}, &mcpserver.HTTPRequest{
		Method: r.Method, URL: &url.URL{Path: r.Path, RawQuery: r.RawQuery}, Header: r.Header(), Body: r.Body,
		Context: WithCaller(r.Context(), c),
	})
}

// admit verifies the request's bearer token and its claim on a session;
// when it fails it has written the answer.
func (a *bearerAuth) admit(w http.ResponseWriter, host string, h interface{ Get(string) string }) (*router.Caller, bool) {
	raw := bearerToken(h.Get("Authorization"))
	c, err := a.router.Authenticate(raw)
	if err != nil {
		metadata := "http://" + host + metadataPath
		value := `Bearer resource_metadata="` + metadata + `"`
		if raw != "" {
			value += `, error="invalid_token", error_description="` + strings.ReplaceAll(tool.ErrorMessage(err), `"`, "'") + `"`
		}
		w.Header().Set("WWW-Authenticate", value)
		http.Error(w, "401 unauthorized: "+tool.ErrorMessage(err), http.StatusUnauthorized)
		return nil, false
	}
	if sid := h.Get(mcpserver.HeaderKeySessionID); sid != "" {
		if owner, ok := a.sessions.Load(sid); ok && owner != c.Sub {
			http.Error(w, "403 forbidden: this session belongs to another subject", http.StatusForbidden)
			return nil, false
		}
	}
	return c, true
}

// localLoopback says whether a connection came in on a loopback address.
func localLoopback(addr net.Addr) bool {
	if a, ok := addr.(*net.TCPAddr); ok {
		return a.IP.IsLoopback()
	}
	return isLoopback(addr.String())
}

// isLoopback says whether addr (a host, or host:port) is a loopback
// address or localhost, as mcp-go judges it.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// sessionRecorder binds a session id the server hands out to the subject
// that asked for it.
type sessionRecorder struct {
	http.ResponseWriter
	auth  *bearerAuth
	sub   string
	wrote bool
}

func (s *sessionRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.wrote = true
		if sid := s.Header().Get(mcpserver.HeaderKeySessionID); sid != "" {
			s.auth.sessions.LoadOrStore(sid, s.sub)
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionRecorder) Write(b []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

func (s *sessionRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// CanStream and SetWriteDeadline make it mcp-go's HTTPResponseWriter.
func (s *sessionRecorder) CanStream() bool {
	_, ok := s.ResponseWriter.(http.Flusher)
	return ok
}

func (s *sessionRecorder) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(s.ResponseWriter).SetWriteDeadline(t)
}

func (s *sessionRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// metadataHandler serves the protected-resource metadata of /mcp; the
// authorization server is whoever mints capgate's tokens, so none is named.
func metadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mcpserver.NewProtectedResourceMetadataHandler(mcpserver.ProtectedResourceMetadataConfig{
			Resource:               "http://" + r.Host + "/mcp",
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "capgate",
		}).ServeHTTP(w, r)
	})
}
