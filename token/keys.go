package token

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"fmt"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
)

// alg is a signature algorithm Verify accepts.
type alg uint8

const (
	algUnknown alg = iota
	algHS256
	algRS256
	algRS384
	algRS512
	algPS256
	algPS384
	algPS512
	algES256
	algES384
	algES512
	algEdDSA
)

const (
	asymmetricAlgs = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA"
	acceptedAlgs   = "HS256, " + asymmetricAlgs
)

var algNames = [...]string{"", "HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

func (a alg) String() string { return algNames[a] }

func algByName(name string) alg {
	for i := algHS256; i <= algEdDSA; i++ {
		if algNames[i] == name {
			return i
		}
	}
	return algUnknown
}

// publicKey is one verification key of the JWKS.
type publicKey struct {
	kid    string
	hasKid bool
	alg    alg // the JWK's alg; algUnknown when it states none
	key    crypto.PublicKey
	kind   string // "RSA", "EC P-256", "EC P-384", "EC P-521", "Ed25519"
}

// kindFor is the key kind an alg needs.
func kindFor(a alg) string {
	switch a {
	case algRS256, algRS384, algRS512, algPS256, algPS384, algPS512:
		return "RSA"
	case algES256:
		return "EC P-256"
	case algES384:
		return "EC P-384"
	case algES512:
		return "EC P-521"
	case algEdDSA:
		return "Ed25519"
	}
	return ""
}

// fits says whether k may verify a token of alg a.
func (k *publicKey) fits(a alg) bool {
	return k.kind == kindFor(a) && (k.alg == algUnknown || k.alg == a)
}

// misfit says why k may not verify a token of alg a.
func (k *publicKey) misfit(a alg) *Error {
	if k.kind != kindFor(a) {
		return fail(ReasonAlgorithm, fmt.Sprintf("alg %s does not fit the JWKS key (an %s key)", a, k.kind))
	}
	if k.alg != algUnknown && k.alg != a {
		return fail(ReasonAlgorithm, fmt.Sprintf("alg %s is not the JWKS key's alg %s", a, k.alg))
	}
	return nil
}

// parseJWKS reads a JWKS's signature verification keys.
func parseJWKS(raw []byte) ([]publicKey, error) {
	kf, err := keyfunc.NewJWKSetJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("token: JWKS: %w", err)
	}
	jwks, err := kf.Storage().KeyReadAll(context.Background())
	if err != nil {
		return nil, fmt.Errorf("token: JWKS: %w", err)
	}
	return keysOf(jwks)
}

// jwkName names the JWKS's key at index i in errors. Only they build it:
// a fetched JWKS's keys are converted on every verification.
func jwkName(i int, kid string) string {
	if kid == "" {
		return fmt.Sprintf("JWKS key %d", i+1)
	}
	return fmt.Sprintf("JWKS key %d (kid %q)", i+1, kid)
}

// keysOf converts a JWKS's keys, refusing any capgate cannot use.
func keysOf(jwks []jwkset.JWK) ([]publicKey, error) {
	if len(jwks) == 0 {
		return nil, fmt.Errorf("token: JWKS has no keys")
	}
	keys := make([]publicKey, 0, len(jwks))
	kids := make(map[string]bool)
	for i, j := range jwks {
		m := j.Marshal()
		if m.USE == "enc" {
			continue // an encryption key
		}
		k := publicKey{kid: m.KID, hasKid: m.KID != ""}
		key := j.Key()
		if pk, ok := key.(interface{ Public() crypto.PublicKey }); ok {
			key = pk.Public()
		}
		switch key := key.(type) {
		case *rsa.PublicKey:
			k.kind = "RSA"
		case *ecdsa.PublicKey:
			switch key.Curve {
			case elliptic.P256():
				k.kind = "EC P-256"
			case elliptic.P384():
				k.kind = "EC P-384"
			case elliptic.P521():
				k.kind = "EC P-521"
			default:
				return nil, fmt.Errorf("token: %s: unsupported curve", jwkName(i, m.KID))
			}
		case ed25519.PublicKey:
			k.kind = "Ed25519"
		case []byte:
			return nil, fmt.Errorf("token: %s is a symmetric (oct) key; HS256 is verified with the shared secret only", jwkName(i, m.KID))
		default:
			return nil, fmt.Errorf("token: %s: kty %q is not a signature key capgate supports (RSA, EC, OKP Ed25519)", jwkName(i, m.KID), m.KTY)
		}
		k.key = key
		if m.ALG != "" {
			k.alg = algByName(string(m.ALG))
			if k.alg == algUnknown || k.alg == algHS256 {
				return nil, fmt.Errorf("token: %s: alg %q is not supported; accepted: %s", jwkName(i, m.KID), m.ALG, asymmetricAlgs)
			}
			if kindFor(k.alg) != k.kind {
				return nil, fmt.Errorf("token: %s: alg %s does not fit its %s key", jwkName(i, m.KID), k.alg, k.kind)
			}
		}
		if k.hasKid {
			if kids[k.kid] {
				return nil, fmt.Errorf("token: %s: another key has the same kid", jwkName(i, m.KID))
			}
			kids[k.kid] = true
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("token: JWKS has no signature keys (all are use \"enc\")")
	}
	return keys, nil
}

// asymmetricKey is the JWKS key the token's kid names, or, without a kid,
// every key that fits its alg (set true): golang-jwt tries each.
func (v *Verifier) asymmetricKey(h header) (key any, set bool, err *Error) {
	keys := v.keys
	if v.remote != nil {
		keys = v.remote.current(h)
	}
	if keys == nil {
		if v.remote != nil {
			return nil, false, fail(ReasonKey, "the JWKS at "+v.remote.url+" could not be read")
		}
		return nil, false, fail(ReasonAlgorithm, fmt.Sprintf("alg %s is not accepted: no JWKS is configured", h.alg))
	}
	if h.hasKid {
		for i := range keys {
			k := &keys[i]
			if !k.hasKid || k.kid != h.kid {
				continue
			}
			if !k.fits(h.alg) {
				return nil, false, k.misfit(h.alg)
			}
			return k.key, false, nil
		}
		return nil, false, fail(ReasonKey, "no JWKS key has the token's kid")
	}
	var fit jwt.VerificationKeySet
	for i := range keys {
		if k := &keys[i]; k.fits(h.alg) {
			fit.Keys = append(fit.Keys, k.key)
		}
	}
	if len(fit.Keys) == 0 {
		return nil, false, fail(ReasonKey, fmt.Sprintf("no JWKS key fits alg %s", h.alg))
	}
	return fit, true, nil
}
