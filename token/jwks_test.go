package token

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// testKeys are generated once: RSA key generation is slow under -race.
type testKeys struct {
	rsa1, rsa2 *rsa.PrivateKey
	ec256      *ecdsa.PrivateKey
	ec384      *ecdsa.PrivateKey
	ed         ed25519.PrivateKey
}

var (
	keysOnce sync.Once
	keys     testKeys
)

func genKeys(t *testing.T) testKeys {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		must := func(e error) {
			if e != nil && err == nil {
				err = e
			}
		}
		keys.rsa1, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		keys.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		keys.ec256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		keys.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		must(err)
		_, keys.ed, err = ed25519.GenerateKey(rand.Reader)
		must(err)
		if err != nil {
			panic(err)
		}
	})
	return keys
}

func b64n(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwk builds a public JWK by hand, as a JWKS file holds it.
func jwk(pub any, kid, alg string) map[string]any {
	m := map[string]any{}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		m["kty"], m["n"], m["e"] = "RSA", b64n(k.N.Bytes()), b64n(big.NewInt(int64(k.E)).Bytes())
	case *ecdsa.PublicKey:
		size := (k.Curve.Params().BitSize + 7) / 8
		m["kty"], m["crv"] = "EC", k.Curve.Params().Name
		m["x"], m["y"] = b64n(k.X.FillBytes(make([]byte, size))), b64n(k.Y.FillBytes(make([]byte, size)))
	case ed25519.PublicKey:
		m["kty"], m["crv"], m["x"] = "OKP", "Ed25519", b64n(k)
	}
	if kid != "" {
		m["kid"] = kid
	}
	if alg != "" {
		m["alg"] = alg
	}
	m["use"] = "sig"
	return m
}

func jwksJSON(t *testing.T, ks ...map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": ks})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// signJWT signs a standard JWT with golang-jwt, as a third-party issuer would.
func signJWT(t *testing.T, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signTyp signs claims like signJWT, under header typ.
func signTyp(t *testing.T, m jwt.SigningMethod, key any, kid, typ string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	tok.Header["kid"], tok.Header["typ"] = kid, typ
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stdClaims(extra map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": testSub, "iat": testNow.Unix(), "exp": testNow.Add(time.Minute).Unix(), "iss": "idp", "caps": []string{"rye.fetch.*"}}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

func TestAsymmetric(t *testing.T) {
	k := genKeys(t)
	set := jwksJSON(t,
		jwk(&k.rsa1.PublicKey, "rsa-1", "RS256"),
		jwk(&k.rsa2.PublicKey, "rsa-2", ""),
		jwk(k.ec256.Public(), "ec-256", ""),
		jwk(k.ec384.Public(), "ec-384", "ES384"),
		jwk(k.ed.Public(), "ed-1", "EdDSA"),
	)
	jwksOnly, err := NewVerifier(Options{JWKS: set, Now: fixedNow, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	both, err := NewVerifier(Options{JWKS: set, Secret: testSecret, Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}

	accepted := []struct {
		name string
		tok  string
	}{
		{"RS256 kid rsa-1", signJWT(t, jwt.SigningMethodRS256, k.rsa1, "rsa-1", stdClaims(nil))},
		{"RS512 kid rsa-2 (no JWK alg)", signJWT(t, jwt.SigningMethodRS512, k.rsa2, "rsa-2", stdClaims(nil))},
		{"PS256 kid rsa-2", signJWT(t, jwt.SigningMethodPS256, k.rsa2, "rsa-2", stdClaims(nil))},
		{"ES256 kid ec-256", signJWT(t, jwt.SigningMethodES256, k.ec256, "ec-256", stdClaims(nil))},
		{"ES384 kid ec-384", signJWT(t, jwt.SigningMethodES384, k.ec384, "ec-384", stdClaims(map[string]any{"aud": []string{"capgate"}}))},
		{"EdDSA kid ed-1", signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", stdClaims(nil))},
		{"ES256 without kid", signJWT(t, jwt.SigningMethodES256, k.ec256, "", stdClaims(nil))},
		{"RS256 without kid, second RSA key", signJWT(t, jwt.SigningMethodRS256, k.rsa2, "", stdClaims(nil))},
		{"EdDSA without kid", signJWT(t, jwt.SigningMethodEdDSA, k.ed, "", stdClaims(nil))},
		{"RS256 at+jwt (RFC 9068)", signTyp(t, jwt.SigningMethodRS256, k.rsa1, "rsa-1", "at+jwt", stdClaims(nil))},
		{"ES256 application/at+jwt", signTyp(t, jwt.SigningMethodES256, k.ec256, "ec-256", "application/at+jwt", stdClaims(nil))},
	}
	for _, tc := range accepted {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []*Verifier{jwksOnly, both} {
				c, err := v.Verify(tc.tok)
				if err != nil {
					t.Fatal(err)
				}
				if c.Sub != testSub || c.Issuer != "idp" || len(c.Caps) != 1 || c.Caps[0] != "rye.fetch.*" || c.ExpiresAt.Unix() != testNow.Add(time.Minute).Unix() {
					t.Errorf("claims %+v", c)
				}
			}
		})
	}

	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: mustPKIX(t, &k.rsa1.PublicKey)})
	rsaDER := mustPKIX(t, &k.rsa1.PublicKey)
	rsaPKCS1 := x509.MarshalPKCS1PublicKey(&k.rsa1.PublicKey)
	payload := string(mustJSON(t, stdClaims(nil)))
	refusals := []struct {
		name   string
		v      *Verifier
		tok    string
		reason Reason
		detail string
	}{
		{"unknown kid", jwksOnly, signJWT(t, jwt.SigningMethodRS256, k.rsa1, "rsa-9", stdClaims(nil)), ReasonKey, "no JWKS key has the token's kid"},
		{"kid of the other RSA key", jwksOnly, signJWT(t, jwt.SigningMethodRS256, k.rsa2, "rsa-1", stdClaims(nil)), ReasonSignature, "RS256 signature does not verify"},
		{"no kid, unknown key", jwksOnly, signJWT(t, jwt.SigningMethodRS256, mustRSA(t), "", stdClaims(nil)), ReasonSignature, "any JWKS key"},
		{"ES256 naming an RSA key", jwksOnly, signJWT(t, jwt.SigningMethodES256, k.ec256, "rsa-2", stdClaims(nil)), ReasonAlgorithm, "does not fit the JWKS key (an RSA key)"},
		{"PS256 against a JWK that says RS256", jwksOnly, signJWT(t, jwt.SigningMethodPS256, k.rsa1, "rsa-1", stdClaims(nil)), ReasonAlgorithm, "not the JWKS key's alg RS256"},
		{"ES384 naming a P-256 key", jwksOnly, signJWT(t, jwt.SigningMethodES384, k.ec384, "ec-256", stdClaims(nil)), ReasonAlgorithm, "EC P-256"},
		{"ES512 without a P-521 key", jwksOnly, signJWT(t, jwt.SigningMethodES512, mustEC(t, elliptic.P521()), "", stdClaims(nil)), ReasonKey, "no JWKS key fits alg ES512"},
		{"wrong audience", jwksOnly, signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", stdClaims(map[string]any{"aud": "elsewhere"})), ReasonAudience, "capgate"},
		{"expired", jwksOnly, signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-1", stdClaims(map[string]any{"exp": testNow.Add(-time.Hour).Unix()})), ReasonExpired, "1h0m0s"},

		// HS256 with JWKS keys only: the alg is not the keys'.
		{"HS256 with JWKS only", jwksOnly, signHS256(testSecret, `{"alg":"HS256","typ":"JWT"}`, payload), ReasonAlgorithm, "no shared secret"},
		// Algorithm switching: HS256 keyed with the RSA public key's bytes.
		{"HS256 keyed with the PEM, JWKS only", jwksOnly, signHS256(rsaPEM, `{"alg":"HS256","typ":"JWT"}`, payload), ReasonAlgorithm, "no shared secret"},
		{"HS256 keyed with the DER, JWKS only", jwksOnly, signHS256(rsaDER, `{"alg":"HS256","typ":"JWT","kid":"rsa-1"}`, payload), ReasonAlgorithm, "JWKS keys never verify HS256"},
		{"HS256 keyed with the PEM naming the RSA kid", both, signHS256(rsaPEM, `{"alg":"HS256","kid":"rsa-1"}`, payload), ReasonAlgorithm, "JWKS keys never verify HS256"},
		{"HS256 keyed with the PKCS1 DER naming the RSA kid", both, signHS256(rsaPKCS1, `{"alg":"HS256","kid":"rsa-1"}`, payload), ReasonAlgorithm, "JWKS keys never verify HS256"},
		{"HS256 keyed with the PEM, no kid", both, signHS256(rsaPEM, `{"alg":"HS256"}`, payload), ReasonSignature, "HS256 signature does not verify"},
		{"RS256 header, HMAC signature", both, signHS256(rsaPEM, `{"alg":"RS256","kid":"rsa-1"}`, payload), ReasonSignature, "RS256 signature does not verify"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			e := refused(t, tc.v, tc.tok, tc.reason, rsaPEM, rsaDER)
			if !strings.Contains(e.Detail, tc.detail) {
				t.Errorf("detail %q lacks %q", e.Detail, tc.detail)
			}
			for _, kid := range []string{"rsa-1", "rsa-2", "rsa-9", "ec-256"} {
				if strings.Contains(e.Error(), kid) {
					t.Errorf("message %q names the token's kid", e)
				}
			}
		})
	}

	// The shared secret still verifies HS256 next to a JWKS, even with a
	// kid the JWKS does not know.
	hs := signHS256(testSecret, `{"alg":"HS256","kid":"shared"}`, payload)
	if _, err := both.Verify(hs); err != nil {
		t.Errorf("HS256 beside a JWKS: %v", err)
	}
}

func TestNewVerifierJWKSErrors(t *testing.T) {
	k := genKeys(t)
	oct := map[string]any{"kty": "oct", "k": b64n([]byte("0123456789abcdef0123456789abcdef")), "kid": "hmac"}
	enc := jwk(&k.rsa1.PublicKey, "enc-1", "")
	enc["use"] = "enc"
	for _, tc := range []struct {
		name string
		jwks []byte
		want string
	}{
		{"not JSON", []byte(`{"keys":[`), "JWKS"},
		{"no keys", []byte(`{"keys":[]}`), "JWKS has no keys"},
		{"bad key", []byte(`{"keys":[{"kty":"RSA","n":"!!","e":"AQAB"}]}`), "JWKS"},
		{"symmetric key", jwksJSON(t, oct), `JWKS key 1 (kid "hmac") is a symmetric (oct) key`},
		{"only an encryption key", jwksJSON(t, enc), "no signature keys"},
		{"duplicate kid", jwksJSON(t, jwk(&k.rsa1.PublicKey, "a", ""), jwk(k.ed.Public(), "a", "")), `JWKS key 2 (kid "a"): another key has the same kid`},
		{"alg not fitting", jwksJSON(t, jwk(&k.rsa1.PublicKey, "r", "ES256")), `JWKS key 1 (kid "r"): alg ES256 does not fit its RSA key`},
		{"HS256 alg", jwksJSON(t, jwk(&k.rsa1.PublicKey, "r", "HS256")), `alg "HS256" is not supported`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(Options{JWKS: tc.jwks, Secret: testSecret})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewVerifier = %v, %v; want an error with %q", v, err, tc.want)
			}
		})
	}
	// A private JWK works as its public half.
	priv := jwk(k.ed.Public(), "ed-priv", "")
	priv["d"] = b64n(k.ed.Seed())
	v, err := NewVerifier(Options{JWKS: jwksJSON(t, priv, enc), Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(signJWT(t, jwt.SigningMethodEdDSA, k.ed, "ed-priv", stdClaims(nil))); err != nil {
		t.Error(err)
	}
	refused(t, v, signJWT(t, jwt.SigningMethodRS256, k.rsa1, "enc-1", stdClaims(nil)), ReasonKey)
}

func mustPKIX(t *testing.T, pub any) []byte {
	t.Helper()
	b, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustRSA(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustEC(t *testing.T, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
