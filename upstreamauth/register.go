package upstreamauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"golang.org/x/oauth2"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// How capgate becomes a client of an authorization server, in the MCP
// specification's order: the operator's pre-registered client id; else a
// Client ID Metadata Document capgate serves under public_url, where the
// server says it supports them (and public_url is https, as they must
// be); else dynamic client registration (RFC 7591), once per issuer and
// redirect URI, kept in the store so that every replica uses the client
// the tokens were issued to.

// ClientMetadataPath is where capgate serves its Client ID Metadata
// Document under public_url.
const ClientMetadataPath = "/oauth/client.json"

// registrarSub is the store subject of capgate's own client
// registrations (under capability "oauth-client <issuer>", which no
// user's credential uses).
const registrarSub = "capgate"

// registration is a client of one authorization server.
type registration struct {
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret,omitempty"`
	AuthMethod   string `json:"token_endpoint_auth_method,omitempty"`
}

// config is the golang.org/x/oauth2 client for up.
func (r *registration) config(up *upstream, redirect string) *oauth2.Config {
	style := oauth2.AuthStyleInParams
	switch {
	case r.ClientSecret == "":
	case r.AuthMethod == "client_secret_post":
	case r.AuthMethod == "client_secret_basic":
		style = oauth2.AuthStyleInHeader
	default:
		style = oauth2.AuthStyleAutoDetect
	}
	return &oauth2.Config{ClientID: r.ClientID, ClientSecret: r.ClientSecret, RedirectURL: redirect, Scopes: up.Scopes,
		Endpoint: oauth2.Endpoint{AuthURL: up.AuthEndpoint, TokenURL: up.TokenEndpoint, AuthStyle: style}}
}

// clientMetadataURL is capgate's CIMD client id, or "" when public_url
// cannot serve one (it must be https).
func (b *Broker) clientMetadataURL() string {
	if !strings.HasPrefix(b.opts.PublicURL, "https://") {
		return ""
	}
	return b.opts.PublicURL + ClientMetadataPath
}

// client returns the client capgate is at up for srv. issued, when set,
// is the client id a stored token was issued to: that one is used.
func (b *Broker) client(ctx context.Context, srv *Server, up *upstream, issued string) (*registration, error) {
	if srv.ClientID != "" && (issued == "" || issued == srv.ClientID) {
		return &registration{ClientID: srv.ClientID, ClientSecret: srv.ClientSecret}, nil
	}
	if cimd := b.clientMetadataURL(); cimd != "" && (issued == cimd || issued == "" && up.CIMD) {
		return &registration{ClientID: cimd}, nil
	}
	capID, ref := "oauth-client "+up.Issuer, b.RedirectURI()
	if raw, err := b.opts.Store.Credential(ctx, registrarSub, capID, ref); err == nil {
		var reg registration
		if err := json.Unmarshal(raw, &reg); err == nil && reg.ClientID != "" && (issued == "" || issued == reg.ClientID) {
			return &reg, nil
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, storeError(srv, err)
	}
	if issued != "" {
		return nil, tool.Errorf(tool.CodeAuthRequired, "mcp server %s: the client the token was issued to is no longer registered", srv.Name)
	}
	if up.RegisterEndpoint == "" {
		return nil, tool.Errorf(tool.CodeBackendUnavailable,
			"mcp server %s: authorization server %s offers neither Client ID Metadata Documents (with an https public_url) nor dynamic registration: "+
				"set [mcp.servers.%s] client_id", srv.Name, up.Issuer, srv.Name)
	}
	reg, err := b.register(ctx, up)
	if err != nil {
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: registering with %s: %v", srv.Name, up.Issuer, err)
	}
	raw, _ := json.Marshal(reg)
	if err := b.opts.Store.PutCredential(ctx, registrarSub, capID, ref, raw); err != nil {
		return nil, storeError(srv, err)
	}
	return reg, nil
}

// clientMetadata is what capgate says of itself as a client: at
// registration and in its Client ID Metadata Document.
func (b *Broker) clientMetadata(clientID string) map[string]any {
	md := map[string]any{
		"client_name":                "capgate",
		"client_uri":                 b.opts.PublicURL,
		"redirect_uris":              []string{b.RedirectURI()},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": "none",
	}
	if clientID != "" {
		md["client_id"] = clientID
	}
	return md
}

// register registers capgate as a public client (PKCE, no secret) at up.
func (b *Broker) register(ctx context.Context, up *upstream) (*registration, error) {
	body, _ := json.Marshal(b.clientMetadata(""))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.RegisterEndpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadata))
	if err != nil {
		return nil, err
	}
	var reg registration
	var refusal struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if resp.StatusCode/100 != 2 {
		json.Unmarshal(raw, &refusal)
		return nil, fmt.Errorf("HTTP %d %s %s", resp.StatusCode, refusal.Error, refusal.Description)
	}
	if err := json.Unmarshal(raw, &reg); err != nil || reg.ClientID == "" {
		return nil, errors.New("the registration response has no client_id")
	}
	return &reg, nil
}
