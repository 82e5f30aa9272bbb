package token

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultTTL is a minted token's lifetime when MintOptions.TTL is zero.
const DefaultTTL = 5 * time.Minute

// MintOptions configure Mint.
type MintOptions struct {
	Ash bool             // write an Ash context token (typ ASH_CONTEXT, ver 1), byte for byte as Ash does
	TTL time.Duration    // lifetime when c.ExpiresAt is zero; default 5m
	Now func() time.Time // default time.Now
}

// The two headers Mint writes, as Python's json.dumps(sort_keys=True,
// separators=(",", ":")) writes them.
const (
	ashHeader = `{"alg":"HS256","typ":"ASH_CONTEXT","ver":1}`
	jwtHeader = `{"alg":"HS256","typ":"JWT"}`
)

// Mint signs c with secret (HS256). Zero IssuedAt is Now, zero ExpiresAt is
// IssuedAt+TTL, an empty ID is 16 random bytes in hex. The payload has
// sorted keys and no spaces, strings escaped as Python's json.dumps escapes
// them, optional string claims only when non-empty, caps and ack when
// non-nil, aud when non-empty (a string for one audience), nbf when
// NotBefore is set. With opts.Ash the header is Ash's and the payload
// carries "ver":1; otherwise the header is {"alg":"HS256","typ":"JWT"}.
func Mint(secret []byte, c Claims, opts MintOptions) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("token: mint: no secret")
	}
	if strings.TrimSpace(c.Sub) == "" {
		return "", errors.New("token: mint: sub is blank")
	}
	if opts.TTL < 0 {
		return "", fmt.Errorf("token: mint: TTL %v is negative", opts.TTL)
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	if c.IssuedAt.IsZero() {
		c.IssuedAt = now()
	}
	if c.ExpiresAt.IsZero() {
		c.ExpiresAt = c.IssuedAt.Add(ttl)
	}
	if c.ID == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("token: mint: %w", err)
		}
		c.ID = hex.EncodeToString(b[:])
	}

	type member struct {
		key string
		val []byte
	}
	var ms []member
	var bad string
	str := func(key, s string) {
		if s == "" {
			return
		}
		if !utf8.ValidString(s) {
			bad = key
		}
		ms = append(ms, member{key, appendPyString(nil, s)})
	}
	list := func(key string, l []string) {
		if l == nil {
			return
		}
		b := []byte{'['}
		for i, s := range l {
			if strings.TrimSpace(s) == "" || !utf8.ValidString(s) {
				bad = key
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = appendPyString(b, s)
		}
		ms = append(ms, member{key, append(b, ']')})
	}
	num := func(key string, t time.Time) {
		ms = append(ms, member{key, strconv.AppendInt(nil, t.Unix(), 10)})
	}

	str("sub", c.Sub)
	num("iat", c.IssuedAt)
	num("exp", c.ExpiresAt)
	if !c.NotBefore.IsZero() {
		num("nbf", c.NotBefore)
	}
	str("jti", c.ID)
	str("iss", c.Issuer)
	str("chat_id", c.ChatID)
	str("chat_type", c.ChatType)
	str("chat_title", c.ChatTitle)
	str("provider", c.Provider)
	str("session_key", c.SessionKey)
	str("thread_id", c.ThreadID)
	str("source_username", c.SourceUsername)
	str("source_display_name", c.SourceDisplayName)
	str("message_id", c.MessageID)
	str("timezone", c.Timezone)
	list("caps", c.Caps)
	list("ack", c.Ack)
	switch len(c.Audience) {
	case 0:
	case 1:
		str("aud", c.Audience[0])
	default:
		list("aud", c.Audience)
	}
	if bad != "" {
		return "", fmt.Errorf("token: mint: claim %s has a blank element or is not valid UTF-8", bad)
	}
	hdr := jwtHeader
	if opts.Ash {
		hdr = ashHeader
		ms = append(ms, member{"ver", []byte("1")})
	}
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.key, b.key) })

	payload := []byte{'{'}
	for i, m := range ms {
		if i > 0 {
			payload = append(payload, ',')
		}
		payload = appendPyString(payload, m.key)
		payload = append(payload, ':')
		payload = append(payload, m.val...)
	}
	payload = append(payload, '}')

	enc := base64.RawURLEncoding
	tok := make([]byte, 0, enc.EncodedLen(len(hdr))+enc.EncodedLen(len(payload))+enc.EncodedLen(sha256.Size)+2)
	tok = enc.AppendEncode(tok, []byte(hdr))
	tok = append(tok, '.')
	tok = enc.AppendEncode(tok, payload)
	mac := hmac.New(sha256.New, secret)
	mac.Write(tok)
	tok = append(tok, '.')
	tok = enc.AppendEncode(tok, mac.Sum(nil))
	return string(tok), nil
}
