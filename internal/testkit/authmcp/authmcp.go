// Package authmcp is an MCP server for tests that requires its
// authorization server's access tokens, as a remote MCP server of the
// MCP authorization specification does: a 401 with WWW-Authenticate
// naming its protected-resource metadata (RFC 9728), which it serves;
// JWT access tokens (RFC 9068) verified against the issuer's JWKS, its
// issuer and this server's resource as audience. Its tool whoami answers
// the subject the call's token belongs to, so a test sees whose account
// each call used.
package authmcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Server is a running protected MCP server.
type Server struct {
	URL      string // the MCP endpoint, which is also its resource identifier
	Metadata string // its protected-resource metadata document

	mu       sync.Mutex
	tokens   []string          // every access token it was sent, verified or not
	sessions map[string]string // MCP session id → the subject that opened it
	mixed    []string          // sessions that saw a second subject
	refuse   map[string]bool   // subjects whose tokens it now refuses
	dead     map[string]bool   // tokens it now refuses
}

type subKey struct{}

// Start serves the MCP server on 127.0.0.1 until the test ends; its
// tokens come from issuer.
func Start(tb testing.TB, issuer string) *Server {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	kf, err := keyfunc.NewDefaultCtx(ctx, []string{issuer + "/jwks"})
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{sessions: map[string]string{}, refuse: map[string]bool{}, dead: map[string]bool{}}
	ms := server.NewMCPServer("authmcp", "1.0.0")
	ms.AddTool(mcp.NewTool("whoami", mcp.WithDescription("Says whose account the call's token belongs to."),
		mcp.WithString("note", mcp.Description("anything; echoed back"))),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sub, _ := ctx.Value(subKey{}).(string)
			note, _ := req.GetArguments()["note"].(string)
			return mcp.NewToolResultStructured(map[string]any{"sub": sub, "note": note}, "you are "+sub), nil
		})
	// Its resource whoami://me says the same of a resources/read.
	ms.AddResource(mcp.NewResource("whoami://me", "whoami", mcp.WithMIMEType("text/plain")),
		func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			sub, _ := ctx.Value(subKey{}).(string)
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "text/plain", Text: "you are " + sub}}, nil
		})
	mux := http.NewServeMux()
	hs := httptest.NewUnstartedServer(mux)
	hs.Start()
	// A caller's open stream (capgate's GET) would hold Close for a minute.
	tb.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
	s.URL = hs.URL + "/mcp"
	s.Metadata = hs.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.HandleFunc("/.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"resource": s.URL, "authorization_servers": []string{issuer},
			"scopes_supported": []string{"mcp:tools"}, "bearer_methods_supported": []string{"header"},
		})
	})
	mcpHTTP := server.NewStreamableHTTPServer(ms, server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
		return context.WithValue(ctx, subKey{}, r.Header.Get("X-Test-Sub"))
	}))
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		challenge := fmt.Sprintf(`Bearer resource_metadata=%q, scope="mcp:tools"`, s.Metadata)
		if !ok {
			w.Header().Set("WWW-Authenticate", challenge)
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		s.mu.Lock()
		s.tokens = append(s.tokens, raw)
		s.mu.Unlock()
		tok, err := jwt.Parse(raw, kf.Keyfunc, jwt.WithIssuer(issuer), jwt.WithAudience(s.URL),
			jwt.WithExpirationRequired(), jwt.WithValidMethods([]string{"RS256", "PS256", "ES256"}))
		sub, _ := tok.Claims.GetSubject()
		typ, _ := tok.Header["typ"].(string)
		s.mu.Lock()
		refused := s.refuse[sub] || s.dead[raw]
		s.mu.Unlock()
		if err != nil || sub == "" || !strings.EqualFold(typ, "at+jwt") || refused {
			w.Header().Set("WWW-Authenticate", challenge+`, error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return
		}
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			s.mu.Lock()
			if first, ok := s.sessions[id]; !ok {
				s.sessions[id] = sub
			} else if first != sub {
				s.mixed = append(s.mixed, fmt.Sprintf("session %s opened by %s, then used by %s", id, first, sub))
			}
			s.mu.Unlock()
		}
		r.Header.Set("X-Test-Sub", sub)
		mcpHTTP.ServeHTTP(w, r)
	})
	return s
}

// Tokens returns every access token the server was sent.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tokens)
}

// Mixed lists the MCP sessions used with more than one subject's token:
// it must stay empty.
func (s *Server) Mixed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mixed)
}

// Refuse makes the server answer 401 to every token of sub from now on
// (as if the account's grant were withdrawn upstream), or again accept
// them.
func (s *Server) Refuse(sub string, refuse bool) {
	s.mu.Lock()
	s.refuse[sub] = refuse
	s.mu.Unlock()
}

// Invalidate makes the server refuse one token it accepted before (the
// token the AS still considers live, as after a key rotation upstream).
func (s *Server) Invalidate(token string) {
	s.mu.Lock()
	s.dead[token] = true
	s.mu.Unlock()
}
