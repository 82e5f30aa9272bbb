package token

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// ParseSecret reads a token secret as Ash's loader does: trimmed; hex when
// it has an even length and only hex digits; else base64url, with or
// without padding; else its raw UTF-8 bytes. It returns nil for a blank s.
func ParseSecret(s string) []byte {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	if len(s)%2 == 0 && isHex(s) {
		b, err := hex.DecodeString(s)
		if err == nil {
			return b
		}
	}
	if b, ok := decodeBase64URL(s); ok {
		return b
	}
	return []byte(s)
}

// EncodeSecret writes a secret so that ParseSecret (and Ash's loader) reads
// it back: base64url without padding, the form a bridge subprocess receives
// in ASH_CONTEXT_TOKEN_SECRET. In the rare case where that text would read
// as hex (even length, hex digits only), it writes hex instead.
func EncodeSecret(b []byte) string {
	s := base64.RawURLEncoding.EncodeToString(b)
	if len(s)%2 == 0 && isHex(s) {
		return hex.EncodeToString(b)
	}
	return s
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// decodeBase64URL decodes base64url text with or without its '=' padding.
func decodeBase64URL(s string) ([]byte, bool) {
	body := strings.TrimRight(s, "=")
	if pad := len(s) - len(body); pad > 0 && (pad > 2 || len(s)%4 != 0) {
		return nil, false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return nil, false
		}
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, false
	}
	return b, true
}
