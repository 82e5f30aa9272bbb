package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/capgate/capgate/internal/testkit"
)

// issuerStorage is zitadel's in-memory example storage with service
// clients of our own: each gets JWT access tokens (the example's are
// opaque) for the audience the test names, and the client "expired" gets
// tokens that expired an hour ago. Signing, discovery, JWKS and the token
// endpoint are the provider's own.
type issuerStorage struct {
	*storage.Storage
	audiences map[string]string // client id → the aud of its tokens
}

const issuerClientSecret = "client-secret"

// jwtClient is a service client that gets JWT access tokens by the client
// credentials grant.
type jwtClient struct{ op.Client }

func (jwtClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (jwtClient) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials}
}

func (s *issuerStorage) ClientCredentials(ctx context.Context, id, secret string) (op.Client, error) {
	if _, ok := s.audiences[id]; !ok || secret != issuerClientSecret {
		return nil, errors.New("wrong client or secret")
	}
	return jwtClient{storage.WebClient(id, secret)}, nil
}

func (s *issuerStorage) ClientCredentialsTokenRequest(ctx context.Context, id string, scopes []string) (op.TokenRequest, error) {
	return &oidc.JWTTokenRequest{Subject: "svc-" + id, Audience: []string{s.audiences[id]}, Scopes: scopes}, nil
}

func (s *issuerStorage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, exp, err := s.Storage.CreateAccessToken(ctx, req)
	if req.GetSubject() == "svc-expired" {
		exp = time.Now().Add(-time.Hour)
	}
	return id, exp, err
}

// startIssuer runs a zitadel OpenID provider on 127.0.0.1 with st and
// returns its issuer URL.
func startIssuer(t *testing.T, st *issuerStorage) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	provider, err := op.NewProvider(&op.Config{CryptoKey: [32]byte{1}, AuthMethodPost: true}, st,
		op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = provider
	srv.Start()
	t.Cleanup(srv.Close)
	return issuer
}

// issuerToken gets an access token from issuer for client by the client
// credentials grant.
func issuerToken(t *testing.T, issuer, client string) string {
	t.Helper()
	resp, err := http.PostForm(issuer+"/oauth/token", url.Values{
		"grant_type": {"client_credentials"}, "client_id": {client}, "client_secret": {issuerClientSecret}, "scope": {"openid"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error_description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.AccessToken == "" {
		t.Fatalf("token from %s for %s: %d %v %s", issuer, client, resp.StatusCode, err, body.Error)
	}
	return body.AccessToken
}

// TestServeOIDC: a real `capgate serve` with [auth.oidc] takes the keys
// from a real OpenID provider's discovery document and JWKS, accepts its
// RS256 access tokens for capgate, refuses its tokens for another
// audience, another issuer's tokens signed with the same key, and expired
// ones, and names the issuer in its protected-resource metadata.
func TestServeOIDC(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	// Two issuers share one storage, so one signing key: only iss tells
	// their tokens apart.
	st := &issuerStorage{Storage: storage.NewStorage(storage.NewUserStore("http://unused")),
		audiences: map[string]string{"agent": "capgate", "other": "another-api", "expired": "capgate"}}
	issuer := startIssuer(t, st)
	stranger := startIssuer(t, st)

	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	config := filepath.Join(dir, "capgate.toml")
	src := fmt.Sprintf("[server]\nlisten = %q\ndata_dir = \"data\"\nsocket = \"-\"\n\n[policy]\ngrants = [\"rye.fetch.*\"]\n\n[auth.oidc]\nissuer = %q\n", addr, issuer)
	if err := os.WriteFile(config, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	_, banner, _ := testkit.ServeLogged(t, testkit.Build(t, capgatePkg), config)
	if !strings.Contains(banner, "OIDC issuer "+issuer) {
		t.Errorf("banner does not name the issuer:\n%s", banner)
	}
	base := "http://" + addr

	if code, www := postInitialize(t, base, issuerToken(t, issuer, "agent")); code != http.StatusOK {
		t.Errorf("the issuer's token for capgate: %d %s", code, www)
	}
	for _, c := range []struct{ name, tok, want string }{
		{"another audience", issuerToken(t, issuer, "other"), `error_description="audience: token audience does not include 'capgate'"`},
		{"another issuer", issuerToken(t, stranger, "agent"), `error_description="issuer: token issuer is not '` + issuer + `'"`},
		{"expired", issuerToken(t, issuer, "expired"), `error_description="expired: token expired 1h0m`},
	} {
		code, www := postInitialize(t, base, c.tok)
		if code != http.StatusUnauthorized || !strings.Contains(www, c.want) {
			t.Errorf("%s: %d, WWW-Authenticate %q, want %q", c.name, code, www, c.want)
		}
	}

	resp, err := http.Get(base + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var meta struct {
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&meta); err != nil || !slices.Equal(meta.AuthorizationServers, []string{issuer}) {
		t.Errorf("metadata authorization_servers %v (%v), want [%s]", meta.AuthorizationServers, err, issuer)
	}
}
