package token

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLeeway is the clock skew allowed on exp, iat and nbf.
const DefaultLeeway = 30 * time.Second

// maxTokenLen bounds the tokens Verify looks at.
const maxTokenLen = 16 << 10

// Options configure a Verifier.
type Options struct {
	Secret   []byte           // HS256 key; nil (or empty) disables HS256
	JWKS     []byte           // raw JWKS JSON; nil disables the asymmetric algorithms
	Audience string           // checked when the token carries aud
	Leeway   time.Duration    // default 30s when zero
	Now      func() time.Time // default time.Now

	// JWKSURL is a JWKS fetched over HTTP and refreshed; Issuer, when set
	// without JWKS or JWKSURL, is an OpenID provider whose discovery
	// document names the JWKS. With Issuer, a token verified by a JWKS key
	// must carry iss equal to it and an aud including Audience.
	JWKSURL string
	Issuer  string
	// Context ends the JWKS refresh; default context.Background.
	Context    context.Context
	HTTPClient *http.Client // default http.DefaultClient
	Logger     *slog.Logger // refresh failures; default discards
}

// Verifier verifies tokens. It is safe for concurrent use. Make one with
// NewVerifier; the zero Verifier is not usable.
type Verifier struct {
	secret   []byte
	keys     []publicKey
	remote   *remoteKeys // a JWKS by URL; keys is nil then
	issuer   string
	audience string
	leeway   time.Duration
	now      func() time.Time
	scratch  sync.Pool // *scratch

	// verified holds the claims of tokens whose signature and claims were
	// checked: a client sends the same token with every call, and checking
	// it again costs more than the rest of the routing. A cached token's
	// time-bound claims are checked again at every use; its signature need
	// not be, as a Verifier's keys never change.
	verified sync.Map // raw token → *Claims
	nCached  atomic.Int64
}

// maxCached bounds the verified-token cache; it starts over when full.
const maxCached = 4096

// scratch is the per-call working memory Verify reuses.
type scratch struct {
	mac hash.Hash // HMAC-SHA256 keyed with the secret; nil without one
	buf []byte
	sum [sha256.Size]byte
}

// NewVerifier returns a Verifier for opts. It fails when neither a secret
// nor a JWKS is given, or when the JWKS cannot be used.
func NewVerifier(opts Options) (*Verifier, error) {
	v := &Verifier{
		audience: opts.Audience,
		leeway:   opts.Leeway,
		now:      opts.Now,
	}
	if len(opts.Secret) > 0 {
		v.secret = slices.Clone(opts.Secret)
	}
	if opts.JWKS != nil {
		keys, err := parseJWKS(opts.JWKS)
		if err != nil {
			return nil, err
		}
		v.keys = keys
	}
	v.issuer = opts.Issuer
	if opts.JWKSURL != "" || opts.Issuer != "" {
		if opts.JWKS != nil {
			return nil, errors.New("token: a JWKS and a JWKS URL or issuer: give one")
		}
		ctx := opts.Context
		if ctx == nil {
			ctx = context.Background()
		}
		logger := opts.Logger
		if logger == nil {
			logger = slog.New(slog.DiscardHandler)
		}
		url := opts.JWKSURL
		if url == "" {
			var err error
			if url, err = Discover(ctx, opts.HTTPClient, opts.Issuer); err != nil {
				return nil, err
			}
		}
		var err error
		if v.remote, err = newRemoteKeys(ctx, url, opts.HTTPClient, logger); err != nil {
			return nil, err
		}
	}
	if v.secret == nil && v.keys == nil && v.remote == nil {
		return nil, errors.New("token: no verification key: give a shared secret (HS256), a JWKS, or both")
	}
	if v.leeway == 0 {
		v.leeway = DefaultLeeway
	}
	if v.leeway < 0 {
		return nil, fmt.Errorf("token: leeway %v is negative", opts.Leeway)
	}
	if v.now == nil {
		v.now = time.Now
	}
	v.scratch.New = func() any {
		s := &scratch{}
		if v.secret != nil {
			s.mac = hmac.New(sha256.New, v.secret)
		}
		return s
	}
	return v, nil
}

var b64 = base64.RawURLEncoding.Strict()

// header is what Verify reads from a token's header.
type header struct {
	alg    alg
	hasKid bool
	kid    string
}

// Verify checks raw's signature, algorithm and claims and returns the
// claims. Surrounding white space is ignored. The header is read first (alg,
// typ, ver, kid), the signature checked next, and only then is the payload
// read. Every failure is a *Error.
func (v *Verifier) Verify(raw string) (*Claims, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fail(ReasonMissing, "no token")
	}
	if len(raw) > maxTokenLen {
		return nil, fail(ReasonFormat, fmt.Sprintf("token is %d bytes, more than the %d allowed", len(raw), maxTokenLen))
	}
	if c, ok := v.verified.Load(raw); ok {
		if err := v.checkClaims(c.(*Claims)); err != nil {
			return nil, err
		}
		return c.(*Claims), nil
	}
	c, err := v.verify(raw)
	if err != nil {
		return nil, err
	}
	if v.remote != nil {
		return c, nil // a fetched JWKS can withdraw a key: check the signature each time
	}
	if v.nCached.Add(1) > maxCached {
		v.verified.Clear()
		v.nCached.Store(1)
	}
	v.verified.Store(raw, c)
	return c, nil
}

// verify checks a token that is not in the cache.
func (v *Verifier) verify(raw string) (*Claims, error) {
	dot1 := strings.IndexByte(raw, '.')
	dot2 := -1
	if dot1 >= 0 {
		if j := strings.IndexByte(raw[dot1+1:], '.'); j >= 0 {
			dot2 = dot1 + 1 + j
		}
	}
	if dot2 < 0 || strings.IndexByte(raw[dot2+1:], '.') >= 0 {
		return nil, fail(ReasonFormat, "a token has three dot-separated parts")
	}
	sc := v.scratch.Get().(*scratch)
	defer v.scratch.Put(sc)

	// One buffer: the token's bytes (the HMAC's input and the base64
	// decoder's), then the decoded header, payload and signature.
	hLen, pLen, sLen := b64.DecodedLen(dot1), b64.DecodedLen(dot2-dot1-1), b64.DecodedLen(len(raw)-dot2-1)
	need := len(raw) + hLen + pLen + sLen
	if cap(sc.buf) < need {
		sc.buf = make([]byte, need)
	}
	buf := sc.buf[:need]
	enc := buf[:copy(buf, raw)]
	signing := enc[:dot2]
	dec := buf[len(raw):]
	hn, err := b64.Decode(dec, enc[:dot1])
	if err != nil {
		return nil, fail(ReasonFormat, "header is not base64url")
	}
	pn, err := b64.Decode(dec[hn:], enc[dot1+1:dot2])
	if err != nil {
		return nil, fail(ReasonFormat, "payload is not base64url")
	}
	sn, err := b64.Decode(dec[hn+pn:], enc[dot2+1:])
	if err != nil {
		return nil, fail(ReasonFormat, "signature is not base64url")
	}
	sig := dec[hn+pn : hn+pn+sn]
	if !json.Valid(dec[:hn]) {
		return nil, fail(ReasonFormat, "header is not JSON")
	}
	// Header and payload as one string, so claims are substrings of it.
	text := string(dec[:hn+pn])
	h, herr := parseHeader(text[:hn])
	if herr != nil {
		return nil, herr
	}
	if err := v.checkSignature(sc, h, raw[:dot2], signing, sig); err != nil {
		return nil, err
	}
	if !json.Valid(dec[hn : hn+pn]) {
		return nil, fail(ReasonFormat, "payload is not JSON")
	}
	c, cerr := parseClaims(text[hn:])
	if cerr != nil {
		return nil, cerr
	}
	if err := v.checkClaims(c); err != nil {
		return nil, err
	}
	if v.issuer != "" && h.alg != algHS256 {
		// The issuer's tokens are for whoever it names in aud: one it
		// minted for another service is not capgate's to accept.
		if c.Issuer != v.issuer {
			return nil, fail(ReasonIssuer, fmt.Sprintf("token issuer is not %q", v.issuer))
		}
		if c.Audience == nil {
			return nil, fail(ReasonAudience, fmt.Sprintf("token has no aud; the issuer's tokens must name %q", v.audience))
		}
	}
	return c, nil
}

// parseHeader reads and checks alg, typ, ver, kid and crit.
func parseHeader(s string) (header, *Error) {
	var h header
	m, ok := newMembers(s)
	if !ok {
		return h, fail(ReasonFormat, "header is not a JSON object")
	}
	var algVal, typVal, verVal string
	for {
		key, val, more := m.next()
		if !more {
			break
		}
		switch keyName(key) {
		case "alg":
			algVal = val
		case "typ":
			typVal = val
		case "ver":
			verVal = val
		case "kid":
			kid, ok := jsonString(val)
			if !ok {
				return h, fail(ReasonFormat, "header kid is not a string")
			}
			h.kid, h.hasKid = kid, true
		case "crit":
			return h, fail(ReasonFormat, "header names critical extensions (crit), which capgate does not support")
		}
	}
	if algVal == "" {
		return h, fail(ReasonAlgorithm, "header has no alg")
	}
	name, ok := jsonString(algVal)
	if !ok {
		return h, fail(ReasonAlgorithm, "header alg is not a string")
	}
	h.alg = algByName(name)
	switch {
	case h.alg != algUnknown:
	case strings.EqualFold(name, "none"):
		return h, fail(ReasonAlgorithm, `alg "none" (an unsigned token) is never accepted`)
	case name == "HS384" || name == "HS512":
		return h, fail(ReasonAlgorithm, "alg "+name+" is not accepted; the shared secret signs HS256 only")
	default:
		return h, fail(ReasonAlgorithm, "unknown alg; accepted: "+acceptedAlgs)
	}
	if typVal != "" {
		typ, ok := jsonString(typVal)
		switch {
		case !ok:
			return h, fail(ReasonAlgorithm, "header typ is not a string")
		case strings.EqualFold(typ, "JWT"):
		// RFC 9068 access tokens (a certified OpenID provider's default,
		// the MCP SDKs' OAuth clients): the same checks follow.
		case strings.EqualFold(typ, "at+jwt"), strings.EqualFold(typ, "application/at+jwt"):
		case strings.EqualFold(typ, "ASH_CONTEXT"):
			if verVal != "" && verVal != "1" {
				return h, fail(ReasonAlgorithm, "an ASH_CONTEXT header's ver must be 1")
			}
		default:
			return h, fail(ReasonAlgorithm, "header typ must be JWT, at+jwt or ASH_CONTEXT")
		}
	}
	return h, nil
}

// checkSignature verifies sig over signing with the key h calls for.
func (v *Verifier) checkSignature(sc *scratch, h header, signingString string, signing, sig []byte) *Error {
	if h.alg == algHS256 {
		if h.hasKid && v.hasKid(h.kid) {
			return fail(ReasonAlgorithm, "HS256 token names a JWKS key by kid; JWKS keys never verify HS256")
		}
		if v.secret == nil {
			return fail(ReasonAlgorithm, "HS256 is not accepted: no shared secret is configured")
		}
		sc.mac.Reset()
		sc.mac.Write(signing)
		if !hmac.Equal(sc.mac.Sum(sc.sum[:0]), sig) {
			return fail(ReasonSignature, "HS256 signature does not verify")
		}
		return nil
	}
	return v.checkAsymmetric(h, signingString, sig)
}

func (v *Verifier) hasKid(kid string) bool {
	keys := v.keys
	if v.remote != nil {
		keys = v.remote.current(header{})
	}
	for i := range keys {
		if keys[i].hasKid && keys[i].kid == kid {
			return true
		}
	}
	return false
}

// parseClaims reads a payload.
func parseClaims(s string) (*Claims, *Error) {
	m, ok := newMembers(s)
	if !ok {
		return nil, fail(ReasonFormat, "payload is not a JSON object")
	}
	c := &Claims{}
	var hasSub, hasIat, hasExp bool
	for {
		key, val, more := m.next()
		if !more {
			break
		}
		name := keyName(key)
		var dst *string
		switch name {
		case "sub":
			if !stringClaim(&c.Sub, val) {
				return nil, wrongType(name, "a string")
			}
			hasSub = true
			continue
		case "iat", "exp", "nbf":
			sec, nsec, ok := jsonSeconds(val)
			if !ok {
				return nil, wrongType(name, "a number of seconds since 1970")
			}
			t := time.Unix(sec, nsec)
			switch name {
			case "iat":
				c.IssuedAt, hasIat = t, true
			case "exp":
				c.ExpiresAt, hasExp = t, true
			default:
				c.NotBefore = t
			}
			continue
		case "caps", "ack":
			list, ok := jsonStrings(val)
			if !ok {
				return nil, wrongType(name, "an array of strings")
			}
			for _, e := range list {
				if strings.TrimSpace(e) == "" {
					return nil, fail(ReasonClaims, "claim "+name+" has a blank element")
				}
			}
			if name == "caps" {
				c.Caps = list
			} else {
				c.Ack = list
			}
			continue
		case "aud":
			if a, ok := jsonString(val); ok {
				c.Audience = []string{a}
			} else if list, ok := jsonStrings(val); ok {
				c.Audience = list
			} else {
				return nil, wrongType(name, "a string or an array of strings")
			}
			continue
		case "jti":
			dst = &c.ID
		case "iss":
			dst = &c.Issuer
		case "chat_id":
			dst = &c.ChatID
		case "chat_type":
			dst = &c.ChatType
		case "chat_title":
			dst = &c.ChatTitle
		case "provider":
			dst = &c.Provider
		case "session_key":
			dst = &c.SessionKey
		case "thread_id":
			dst = &c.ThreadID
		case "source_username":
			dst = &c.SourceUsername
		case "source_display_name":
			dst = &c.SourceDisplayName
		case "message_id":
			dst = &c.MessageID
		case "timezone":
			dst = &c.Timezone
		default:
			continue // claims capgate does not use
		}
		if val == "null" { // an optional claim Python wrote as None
			*dst = ""
			continue
		}
		if !stringClaim(dst, val) {
			return nil, wrongType(name, "a string")
		}
	}
	switch {
	case !hasSub:
		return nil, fail(ReasonClaims, "no sub claim (the caller's identity)")
	case strings.TrimSpace(c.Sub) == "":
		return nil, fail(ReasonClaims, "sub claim is blank")
	case !hasIat:
		return nil, fail(ReasonClaims, "no iat claim")
	case !hasExp:
		return nil, fail(ReasonClaims, "no exp claim")
	}
	return c, nil
}

func stringClaim(dst *string, val string) bool {
	s, ok := jsonString(val)
	if ok {
		*dst = s
	}
	return ok
}

func wrongType(claim, want string) *Error {
	return fail(ReasonClaims, "claim "+claim+" is not "+want)
}

// checkClaims checks the times and the audience.
func (v *Verifier) checkClaims(c *Claims) *Error {
	now := v.now()
	if late := now.Sub(c.ExpiresAt); late > v.leeway {
		return fail(ReasonExpired, "token expired "+late.Round(time.Second).String()+" ago")
	}
	if early := c.IssuedAt.Sub(now); early > v.leeway {
		return fail(ReasonNotYetValid, "token issued "+early.Round(time.Second).String()+" in the future")
	}
	if !c.NotBefore.IsZero() {
		if early := c.NotBefore.Sub(now); early > v.leeway {
			return fail(ReasonNotYetValid, "token not valid for another "+early.Round(time.Second).String()+" (nbf)")
		}
	}
	if c.Audience != nil {
		if v.audience != "" && !slices.Contains(c.Audience, v.audience) {
			return fail(ReasonAudience, fmt.Sprintf("token audience does not include %q", v.audience))
		}
		// A bridge provider's per-call token is for that provider only,
		// whatever else its aud lists.
		for _, a := range c.Audience {
			if strings.HasPrefix(a, BridgeAudiencePrefix) && a != v.audience {
				return fail(ReasonAudience, "token is a bridge provider's per-call token, not accepted here")
			}
		}
	}
	return nil
}
