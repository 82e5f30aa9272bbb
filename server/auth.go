package server

import (
	"net/http"
	"strings"
	"sync"

	mcpserver "github.com/mark3labs/mcp-go/server"

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
	next     http.Handler
	sessions sync.Map // Mcp-Session-Id → sub
}

func (a *bearerAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw := bearer(r)
	c, err := a.router.Authenticate(raw)
	if err != nil {
		metadata := "http://" + r.Host + metadataPath
		value := `Bearer resource_metadata="` + metadata + `"`
		if raw != "" {
			value += `, error="invalid_token", error_description="` + strings.ReplaceAll(tool.ErrorMessage(err), `"`, "'") + `"`
		}
		w.Header().Set("WWW-Authenticate", value)
		http.Error(w, "401 unauthorized: "+tool.ErrorMessage(err), http.StatusUnauthorized)
		return
	}
	if sid := r.Header.Get(mcpserver.HeaderKeySessionID); sid != "" {
		if owner, ok := a.sessions.Load(sid); ok && owner != c.Sub {
			http.Error(w, "403 forbidden: this session belongs to another subject", http.StatusForbidden)
			return
		}
	}
	a.next.ServeHTTP(&sessionRecorder{ResponseWriter: w, auth: a, sub: c.Sub}, r.WithContext(WithCaller(r.Context(), c)))
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
