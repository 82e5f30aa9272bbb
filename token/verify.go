package token

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"
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
	parser   *jwt.Parser

	// verified holds the claims of tokens whose signature and claims were
	// checked: a client sends the same token with every call, and checking
	// it again costs more than the rest of the routing. A cached token's
	// time-bound claims are checked again at every use; its signature need
	// not be, as a Verifier's keys never change. It forgets the least
	// recently used token when full.
	verified *lru.Cache[string, *Claims]
}

// maxCached bounds the verified-token cache.
const maxCached = 4096

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
	// Claims are checked by checkClaims, with capgate's leeway and
	// reasons; golang-jwt parses, picks the method and checks signatures.
	v.parser = jwt.NewParser(jwt.WithValidMethods(acceptedMethods), jwt.WithStrictDecoding(),
		jwt.WithoutClaimsValidation())
	v.verified, _ = lru.New[string, *Claims](maxCached)
	return v, nil
}

// header is what Verify reads from a token's header.
type header struct {
	alg    alg
	hasKid bool
	kid    string
}

// acceptedMethods are the algs golang-jwt may verify; anything else is
// refused before a key is looked up.
var acceptedMethods = func() []string {
	var out []string
	for a := algHS256; a <= algEdDSA; a++ {
		out = append(out, a.String())
	}
	return out
}()

// Verify checks raw's signature, algorithm and claims and returns the
// claims. Surrounding white space is ignored. golang-jwt splits and
// decodes the token and checks the signature with the key the header
// calls for (checked first: alg, typ, ver, kid, crit); only a token whose
// signature verifies has its claims read. Every failure is a *Error.
func (v *Verifier) Verify(raw string) (*Claims, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fail(ReasonMissing, "no token")
	}
	if len(raw) > maxTokenLen {
		return nil, fail(ReasonFormat, fmt.Sprintf("token is %d bytes, more than the %d allowed", len(raw), maxTokenLen))
	}
	if c, ok := v.verified.Get(raw); ok {
		if err := v.checkClaims(c); err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := v.verify(raw)
	if err != nil {
		return nil, err
	}
	if v.remote != nil {
		return c, nil // a fetched JWKS can withdraw a key: check the signature each time
	}
	v.verified.Add(raw, c)
	return c, nil
}

// payload holds a token's payload as golang-jwt decoded it from base64:
// it is read only after the signature verified (readClaims). golang-jwt
// has encoding/json check that it is JSON first.
type payload struct {
	raw []byte
	jwt.RegisteredClaims
}

func (p *payload) UnmarshalJSON(b []byte) error {
	p.raw = b
	return nil
}

// verify checks a token that is not in the cache.
func (v *Verifier) verify(raw string) (*Claims, error) {
	var p payload
	var h header
	var keySet bool // the signature was checked against every key that fits
	tok, err := v.parser.ParseWithClaims(raw, &p, func(t *jwt.Token) (any, error) {
		var herr *Error
		if h, herr = parseHeader(t.Header); herr != nil {
			return nil, herr
		}
		key, set, kerr := v.key(h)
		if kerr != nil {
			return nil, kerr
		}
		keySet = set
		return key, nil
	})
	if err != nil {
		return nil, refusal(tok, &p, h, keySet, err)
	}
	c, cerr := readClaims(p.raw)
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

// refusal is the *Error for golang-jwt's err: the header's own refusal
// when it has one, else one named by how far golang-jwt got (its details
// may quote the token, so none is passed on).
func refusal(tok *jwt.Token, p *payload, h header, keySet bool, err error) *Error {
	var te *Error
	if errors.As(err, &te) {
		return te
	}
	var b64err base64.CorruptInputError
	notBase64 := errors.As(err, &b64err)
	switch {
	case tok == nil:
		return fail(ReasonFormat, "a token has three dot-separated parts")
	case tok.Header == nil && notBase64:
		return fail(ReasonFormat, "header is not base64url")
	case tok.Header == nil:
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fail(ReasonFormat, "header is not a JSON object")
		}
		return fail(ReasonFormat, "header is not JSON")
	}
	if _, herr := parseHeader(tok.Header); herr != nil {
		return herr
	}
	switch {
	case p.raw == nil && notBase64:
		return fail(ReasonFormat, "payload is not base64url")
	case p.raw == nil && errors.Is(err, jwt.ErrTokenMalformed):
		return fail(ReasonFormat, "payload is not JSON")
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fail(ReasonFormat, "signature is not base64url")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid) && keySet:
		return fail(ReasonSignature, fmt.Sprintf("%s signature does not verify with any JWKS key", h.alg))
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return fail(ReasonSignature, fmt.Sprintf("%s signature does not verify", h.alg))
	}
	return fail(ReasonFormat, "token is not a JWT golang-jwt can read")
}

// parseHeader reads and checks alg, typ, ver, kid and crit of a header
// golang-jwt decoded.
func parseHeader(m map[string]any) (header, *Error) {
	var h header
	if _, ok := m["crit"]; ok {
		return h, fail(ReasonFormat, "header names critical extensions (crit), which capgate does not support")
	}
	if k, ok := m["kid"]; ok {
		kid, ok := k.(string)
		if !ok {
			return h, fail(ReasonFormat, "header kid is not a string")
		}
		h.kid, h.hasKid = kid, true
	}
	a, ok := m["alg"]
	if !ok {
		return h, fail(ReasonAlgorithm, "header has no alg")
	}
	name, ok := a.(string)
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
	if t, ok := m["typ"]; ok {
		typ, ok := t.(string)
		switch {
		case !ok:
			return h, fail(ReasonAlgorithm, "header typ is not a string")
		case strings.EqualFold(typ, "JWT"):
		// RFC 9068 access tokens (a certified OpenID provider's default,
		// the MCP SDKs' OAuth clients): the same checks follow.
		case strings.EqualFold(typ, "at+jwt"), strings.EqualFold(typ, "application/at+jwt"):
		case strings.EqualFold(typ, "ASH_CONTEXT"):
			if ver, ok := m["ver"]; ok && ver != float64(1) {
				return h, fail(ReasonAlgorithm, "an ASH_CONTEXT header's ver must be 1")
			}
		default:
			return h, fail(ReasonAlgorithm, "header typ must be JWT, at+jwt or ASH_CONTEXT")
		}
	}
	return h, nil
}

// key is what golang-jwt checks the signature with: the secret for
// HS256, else the JWKS key the kid names or (set true) every key that
// fits the alg.
func (v *Verifier) key(h header) (key any, set bool, err *Error) {
	if h.alg == algHS256 {
		if h.hasKid && v.hasKid(h.kid) {
			return nil, false, fail(ReasonAlgorithm, "HS256 token names a JWKS key by kid; JWKS keys never verify HS256")
		}
		if v.secret == nil {
			return nil, false, fail(ReasonAlgorithm, "HS256 is not accepted: no shared secret is configured")
		}
		return v.secret, false, nil
	}
	return v.asymmetricKey(h)
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

// readClaims reads a payload whose signature verified: strictly (no
// member twice), in order, so the first wrong claim is the one named.
func readClaims(raw []byte) (*Claims, *Error) {
	d := jsontext.NewDecoder(bytes.NewReader(raw), jsontext.AllowInvalidUTF8(true))
	if t, err := d.ReadToken(); err != nil || t.Kind() != '{' {
		return nil, fail(ReasonFormat, "payload is not a JSON object")
	}
	c := &Claims{}
	var hasSub, hasIat, hasExp bool
	for d.PeekKind() != '}' {
		t, err := d.ReadToken()
		if err != nil {
			return nil, payloadError(err)
		}
		name := t.String()
		val, err := d.ReadValue()
		if err != nil {
			return nil, payloadError(err)
		}
		var dst *string
		switch name {
		case "sub":
			if !stringClaim(&c.Sub, val) {
				return nil, wrongType(name, "a string")
			}
			hasSub = true
			continue
		case "iat", "exp", "nbf":
			if val.Kind() != '0' {
				return nil, wrongType(name, "a number of seconds since 1970")
			}
			sec, nsec, ok := jsonSeconds(string(val))
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
			var a string
			if stringClaim(&a, val) {
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
		if val.Kind() == 'n' { // an optional claim Python wrote as None
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

// payloadError names what jsontext refused in a payload: a claim twice
// is refused, as readers that keep the first and the last would disagree.
func payloadError(err error) *Error {
	if errors.Is(err, jsontext.ErrDuplicateName) {
		return fail(ReasonFormat, "payload has a claim twice")
	}
	return fail(ReasonFormat, "payload is not JSON")
}

// jsonStrings decodes an array of strings (valid UTF-8 each).
func jsonStrings(val jsontext.Value) ([]string, bool) {
	if val.Kind() != '[' {
		return nil, false
	}
	var elems []jsontext.Value
	if jsonv2.Unmarshal(val, &elems) != nil {
		return nil, false
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		if !stringClaim(&out[i], e) {
			return nil, false
		}
	}
	return out, true
}

// stringClaim decodes a JSON string that is valid UTF-8.
func stringClaim(dst *string, val jsontext.Value) bool {
	return val.Kind() == '"' && jsonv2.Unmarshal(val, dst) == nil
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
