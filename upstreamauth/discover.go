package upstreamauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/capgate/capgate/internal/httpadmit"
)

// What the MCP authorization specification has a client find out about a
// protected MCP server before it asks a user to sign in: the server's
// protected-resource metadata (RFC 9728), named by its 401's
// WWW-Authenticate or found at the well-known URI, then its authorization
// server's metadata (RFC 8414, else OpenID discovery).

// upstream is what discovery found for one server.
type upstream struct {
	Issuer           string   `json:"issuer"`
	Resource         string   `json:"resource"`
	AuthEndpoint     string   `json:"authorization_endpoint"`
	TokenEndpoint    string   `json:"token_endpoint"`
	RevokeEndpoint   string   `json:"revocation_endpoint,omitempty"`
	RegisterEndpoint string   `json:"registration_endpoint,omitempty"`
	CIMD             bool     `json:"client_id_metadata_document_supported,omitempty"`
	Scopes           []string `json:"scopes,omitempty"`
}

// maxMetadata bounds a metadata document.
const maxMetadata = 1 << 20

// discover finds srv's resource and authorization server.
func (b *Broker) discover(ctx context.Context, srv *Server) (*upstream, error) {
	challenge, err := b.challenge(ctx, srv.URL)
	if err != nil {
		return nil, err
	}
	var prm struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
		ScopesSupported      []string `json:"scopes_supported"`
	}
	var from string
	for _, u := range prmURLs(srv.URL, challenge["resource_metadata"]) {
		if err = b.getJSON(ctx, u, &prm); err == nil {
			from = u
			break
		}
	}
	if from == "" {
		return nil, fmt.Errorf("no protected-resource metadata (RFC 9728) for %s: %w", srv.URL, err)
	}
	if prm.Resource == "" || !covers(prm.Resource, srv.URL) {
		return nil, fmt.Errorf("the protected-resource metadata at %s names resource %q, which is not %s", from, prm.Resource, srv.URL)
	}
	if len(prm.AuthorizationServers) == 0 {
		return nil, fmt.Errorf("the protected-resource metadata at %s names no authorization server", from)
	}
	issuer := prm.AuthorizationServers[0]
	up, err := b.asMetadata(ctx, issuer)
	if err != nil {
		return nil, err
	}
	up.Resource = prm.Resource
	switch {
	case len(srv.Scopes) > 0:
		up.Scopes = srv.Scopes
	case challenge["scope"] != "":
		up.Scopes = strings.Fields(challenge["scope"])
	default:
		up.Scopes = prm.ScopesSupported
	}
	return up, nil
}

// challenge posts an unauthenticated initialize to the MCP endpoint and
// returns the auth-params of the Bearer challenge of its 401.
func (b *Broker) challenge(ctx context.Context, endpoint string) (map[string]string, error) {
	body := `{"jsonrpc":"2.0","id":"capgate-discover","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"capgate","version":"1"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching %s: %w", endpoint, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		// No challenge: the well-known URI may still say.
		return map[string]string{}, nil
	}
	return httpadmit.BearerChallenge(resp.Header.Values("WWW-Authenticate")), nil
}

// prmURLs are where srv's protected-resource metadata may be: the URL its
// challenge named, else the well-known URIs with and without its path.
func prmURLs(endpoint, named string) []string {
	if named != "" {
		return []string{named}
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil
	}
	base := u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource"
	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		return []string{base + p, base}
	}
	return []string{base}
}

// covers says whether resource identifies endpoint: the same URL, or a
// path above it on the same origin.
func covers(resource, endpoint string) bool {
	resource = strings.TrimSuffix(resource, "/")
	return resource == strings.TrimSuffix(endpoint, "/") || strings.HasPrefix(endpoint, resource+"/")
}

// asMetadata reads issuer's authorization-server metadata: RFC 8414's
// well-known URI, else OpenID discovery (both placements).
func (b *Broker) asMetadata(ctx context.Context, issuer string) (*upstream, error) {
	u, err := url.Parse(issuer)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("authorization server %q is not a URL", issuer)
	}
	origin, path := u.Scheme+"://"+u.Host, strings.TrimSuffix(u.Path, "/")
	candidates := []string{
		origin + "/.well-known/oauth-authorization-server" + path,
		origin + "/.well-known/openid-configuration" + path,
		strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration",
	}
	var md struct {
		Issuer               string   `json:"issuer"`
		AuthEndpoint         string   `json:"authorization_endpoint"`
		TokenEndpoint        string   `json:"token_endpoint"`
		RevokeEndpoint       string   `json:"revocation_endpoint"`
		RegisterEndpoint     string   `json:"registration_endpoint"`
		CodeChallenges       []string `json:"code_challenge_methods_supported"`
		CIMD                 bool     `json:"client_id_metadata_document_supported"`
		ResponseTypes        []string `json:"response_types_supported"`
		AuthorizationDetails any      `json:"-"`
	}
	for _, c := range candidates {
		if err = b.getJSON(ctx, c, &md); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("no authorization-server metadata (RFC 8414 or OpenID discovery) for %s: %w", issuer, err)
	}
	switch {
	case md.Issuer != issuer:
		return nil, fmt.Errorf("the metadata of authorization server %s names issuer %q", issuer, md.Issuer)
	case md.AuthEndpoint == "" || md.TokenEndpoint == "":
		return nil, fmt.Errorf("authorization server %s has no authorization or token endpoint", issuer)
	case !slices.Contains(md.CodeChallenges, "S256"):
		// The MCP specification: no PKCE S256, no authorization.
		return nil, fmt.Errorf("authorization server %s does not support PKCE S256 (code_challenge_methods_supported)", issuer)
	}
	return &upstream{Issuer: issuer, AuthEndpoint: md.AuthEndpoint, TokenEndpoint: md.TokenEndpoint,
		RevokeEndpoint: md.RevokeEndpoint, RegisterEndpoint: md.RegisterEndpoint, CIMD: md.CIMD}, nil
}

// getJSON reads one JSON document.
func (b *Broker) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadata))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: not JSON: %w", u, err)
	}
	return nil
}
