// Package token verifies and mints capgate's context tokens: Ash context
// tokens (typ ASH_CONTEXT, HS256 with the shared secret) and standard JWTs
// (HS256 with the shared secret, or RS*/PS*/ES*/EdDSA with a JWKS key).
//
// A token carries the caller's identity (sub, chat_id, chat_type, ...) and,
// optionally, capgate's own claims: caps (capability patterns), ack
// (acknowledged risk tiers) and the standard aud.
//
// Every failure is a *Error with a Reason. Its message never contains the
// token, any part of it, any claim value, or the secret.
package token

import (
	"errors"
	"time"
)

// Code is the stable error code of every verification failure.
const Code = "token_invalid"

// Reason says why a token was refused.
type Reason string

// The reasons a token is refused.
const (
	ReasonMissing     Reason = "missing"       // no token at all
	ReasonFormat      Reason = "format"        // not three parts, bad base64url, bad JSON
	ReasonAlgorithm   Reason = "algorithm"     // none, unknown, not the key's algorithm, no key of that kind configured, wrong typ
	ReasonSignature   Reason = "signature"     // the signature does not verify
	ReasonExpired     Reason = "expired"       // exp is past, beyond the leeway
	ReasonNotYetValid Reason = "not_yet_valid" // iat or nbf is in the future, beyond the leeway
	ReasonClaims      Reason = "claims"        // sub, iat or exp missing; a claim of the wrong type; bad caps or ack
	ReasonAudience    Reason = "audience"      // aud does not contain the configured audience
	ReasonKey         Reason = "key"           // no JWKS key for the token's kid, or none fitting its alg
	ReasonIssuer      Reason = "issuer"        // iss is not the configured OIDC issuer
)

// Error is a refused token.
type Error struct {
	Reason Reason
	Detail string // never contains the token, a claim value or the secret
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return Code + ": " + string(e.Reason)
	}
	return Code + ": " + string(e.Reason) + ": " + e.Detail
}

// Is reports whether target is a *Error with the same Reason (and, when
// target has a Detail, the same Detail), so errors.Is(err, token.ErrExpired)
// works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Reason == e.Reason && (t.Detail == "" || t.Detail == e.Detail)
}

// Sentinels for errors.Is, one per Reason.
var (
	ErrMissing     = &Error{Reason: ReasonMissing}
	ErrFormat      = &Error{Reason: ReasonFormat}
	ErrAlgorithm   = &Error{Reason: ReasonAlgorithm}
	ErrSignature   = &Error{Reason: ReasonSignature}
	ErrExpired     = &Error{Reason: ReasonExpired}
	ErrNotYetValid = &Error{Reason: ReasonNotYetValid}
	ErrClaims      = &Error{Reason: ReasonClaims}
	ErrAudience    = &Error{Reason: ReasonAudience}
	ErrKey         = &Error{Reason: ReasonKey}
	ErrIssuer      = &Error{Reason: ReasonIssuer}
)

// ReasonOf returns the Reason of a token error anywhere in err's chain, or
// "" when err is not one.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

func fail(r Reason, detail string) *Error { return &Error{Reason: r, Detail: detail} }

// Claims are a verified token's claims.
type Claims struct {
	Sub                 string
	IssuedAt, ExpiresAt time.Time
	NotBefore           time.Time // zero when absent
	ID                  string    // jti

	ChatID            string
	ChatType          string
	ChatTitle         string
	Provider          string
	SessionKey        string
	ThreadID          string
	SourceUsername    string
	SourceDisplayName string
	MessageID         string
	Timezone          string

	Caps     []string // nil when the token has no caps claim; non-nil (maybe empty) when present
	Ack      []string // nil when absent
	Audience []string // nil when absent
	Issuer   string
}
