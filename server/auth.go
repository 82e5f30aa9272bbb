package server

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// metadataPath is where the RFC 9728 protected-resource metadata of /mcp
// lives.
const metadataPath = "/.well-known/oauth-protected-resource/mcp"

// bearerAuth verifies the bearer token of every request before next sees
// it, and puts the caller in the request's context. A missing or bad token
// gets 401 with WWW-Authenticate pointing at the metadata document. A
// session belongs to the subject that opened it (see sessionIDs).
type bearerAuth struct {
	mcp  *MCP
	next http.Handler
}

func (a *bearerAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, ok := a.admit(r.Context(), w, r.Method, r.Host, r.Header)
	if !ok {
		return
	}
	ctx := router.WithCallerToken(WithCaller(r.Context(), c), c, httpadmit.BearerToken(r.Header.Get("Authorization")))
	a.next.ServeHTTP(w, r.WithContext(ctx))
}

// admit verifies the request's bearer token and its claim on a session;
// when it fails it has written the answer.
func (a *bearerAuth) admit(ctx context.Context, w http.ResponseWriter, method, host string, h http.Header) (*router.Caller, bool) {
	raw := httpadmit.BearerToken(h.Get("Authorization"))
	c, err := a.mcp.rt().Authenticate(raw)
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
	// mcp-go asks sessionIDs about the session id of a POST but not of a GET,
	// and a DELETE from anyone would drop the session's state; this covers
	// all three. A POST on protocol 2026-07-28 has no session, and mcp-go
	// ignores the header there.
	if sid := h.Get(mcpserver.HeaderKeySessionID); sid != "" {
		modern := method == http.MethodPost && mcp.IsModernProtocol(h.Get(mcp.HeaderProtocolVersion))
		if !modern && !a.mcp.ownsSession(sid, c.Sub) {
			http.Error(w, "404 not found: no such session for this subject; open a new one with initialize", http.StatusNotFound)
			return nil, false
		}
		if !modern && !a.sessionLives(ctx, w, method, sid) {
			return nil, false
		}
	}
	return c, true
}

// sessionLives ends session sid on its client's DELETE (mcp-go then
// drops its state and answers), and answers 404 to any other request of
// a session that ended, on whichever replica (ended.go). A store that
// cannot say fails closed.
func (a *bearerAuth) sessionLives(ctx context.Context, w http.ResponseWriter, method, sid string) bool {
	var err error
	if method == http.MethodDelete {
		err = a.mcp.ends.end(ctx, sid)
	} else {
		var ended bool
		if ended, err = a.mcp.ends.ended(ctx, sid); err == nil && ended {
			http.Error(w, "404 not found: the client ended this session; open a new one with initialize", http.StatusNotFound)
			return false
		}
	}
	if err != nil {
		http.Error(w, "503 service unavailable: the session's state cannot be checked: "+string(tool.CodeBackendUnavailable), http.StatusServiceUnavailable)
		return false
	}
	return true
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

// metadataHandler serves the protected-resource metadata of /mcp. With an
// OIDC issuer it names it under authorization_servers, so OAuth-speaking
// clients can get a token there; without one no OAuth flow could end in a
// token capgate accepts, so none is invited.
func metadataHandler(issuer string) http.Handler {
	var servers []string
	if issuer != "" {
		servers = []string{issuer}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mcpserver.NewProtectedResourceMetadataHandler(mcpserver.ProtectedResourceMetadataConfig{
			Resource:               "http://" + r.Host + "/mcp",
			AuthorizationServers:   servers,
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "capgate",
		}).ServeHTTP(w, r)
	})
}
