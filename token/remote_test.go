package token

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// jwksServer serves a JWKS on a real listener, counting its fetches; set
// replaces the keys it serves.
type jwksServer struct {
	url     string
	fetches atomic.Int32
	mu      sync.Mutex
	body    []byte
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{body: body}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(s.body)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/jwks.json"
	return s
}

func (s *jwksServer) set(body []byte) {
	s.mu.Lock()
	s.body = body
	s.mu.Unlock()
}

// TestJWKSURL: keys fetched from a URL verify RS256, ES256 and EdDSA; a
// token naming a new kid makes one refetch, which finds a rotated-in key;
// another unknown kid soon after makes none (the refresh is rate-limited)
// and is refused.
func TestJWKSURL(t *testing.T) {
	k := genKeys(t)
	srv := newJWKSServer(t, jwksJSON(t, jwk(&k.rsa1.PublicKey, "rsa-1", "RS256"), jwk(&k.ec256.PublicKey, "ec-256", ""), jwk(k.ed.Public(), "ed-1", "")))
	v, err := NewVerifier(Options{JWKSURL: srv.url, Now: fixedNow, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m   jwt.SigningMethod
		key any
		kid string
	}{{jwt.SigningMethodRS256, k.rsa1, "rsa-1"}, {jwt.SigningMethodES256, k.ec256, "ec-256"}, {jwt.SigningMethodEdDSA, k.ed, "ed-1"}} {
		if _, err := v.Verify(signJWT(t, c.m, c.key, c.kid, stdClaims(nil))); err != nil {
			t.Errorf("%s: %v", c.m.Alg(), err)
		}
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Errorf("%d fetches for known kids, want 1", n)
	}

	srv.set(jwksJSON(t, jwk(&k.rsa1.PublicKey, "rsa-1", "RS256"), jwk(&k.rsa2.PublicKey, "rsa-2", "RS256")))
	if _, err := v.Verify(signJWT(t, jwt.SigningMethodRS256, k.rsa2, "rsa-2", stdClaims(nil))); err != nil {
		t.Errorf("rotated-in key: %v", err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d fetches after a new kid, want 2", n)
	}
	_, err = v.Verify(signJWT(t, jwt.SigningMethodRS256, k.rsa2, "rsa-9", stdClaims(nil)))
	if ReasonOf(err) != ReasonKey {
		t.Errorf("unknown kid: %v", err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d fetches after a second new kid within the minute, want still 2", n)
	}
}

// TestJWKSURLUnreachable: a JWKS that cannot be fetched fails the start.
func TestJWKSURLUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	_, err := NewVerifier(Options{JWKSURL: srv.URL + "/jwks.json"})
	if err == nil || !strings.Contains(err.Error(), "JWKS "+srv.URL) {
		t.Errorf("unreachable JWKS: %v", err)
	}
}

// TestIssuerClaims: with an issuer, a JWKS-verified token must name it as
// iss and carry an aud.
func TestIssuerClaims(t *testing.T) {
	k := genKeys(t)
	srv := newJWKSServer(t, jwksJSON(t, jwk(k.ed.Public(), "ed-1", "")))
	issuer := strings.TrimSuffix(srv.url, "/jwks.json")
	// The JWKS by URL, the issuer given: Verify checks iss without discovery.
	v, err := NewVerifier(Options{JWKSURL: srv.url, Issuer: issuer, Now: fixedNow, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	ok := stdClaims(map[string]any{"iss": issuer, "aud": "capgate"})
	if _, err := v.Verify(signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", ok)); err != nil {
		t.Errorf("the issuer's token: %v", err)
	}
	noAud := stdClaims(map[string]any{"iss": issuer})
	if _, err := v.Verify(signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", noAud)); ReasonOf(err) != ReasonAudience {
		t.Errorf("no aud: %v", err)
	}
	other := stdClaims(map[string]any{"iss": "https://elsewhere", "aud": "capgate"})
	if _, err := v.Verify(signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", other)); ReasonOf(err) != ReasonIssuer {
		t.Errorf("another issuer: %v", err)
	}
}
