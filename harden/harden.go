// Package harden decides whether bytes an upstream produced (a tool's
// result, a resource's contents, a prompt, an error message) may reach a
// caller: what holds a credential-like key, a well-known token format, or
// cannot be inspected is withheld whole, never redacted. Every path that
// carries upstream bytes to a caller goes through it. It imports only tool,
// so that sources, router and server can all use it.
package harden

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/capgate/capgate/tool"
)

// MaxDepth bounds how deep a value is walked, JSON inside strings
// included. Past it the value is withheld: what cannot be inspected is not
// passed.
const MaxDepth = 64

// Gate is the router gate that withholds output.
const Gate = "output"

// Withheld is the error for withheld output: capability_invalid_output
// naming what was found (a key's name, a token's format), never a value.
func Withheld(what, finding string) *tool.Error {
	return &tool.Error{Code: tool.CodeInvalidOutput, Gate: Gate,
		Message: fmt.Sprintf("the output of %s was withheld: it holds %s", what, finding),
		Hint:    "the tool's source must not return credentials"}
}

// Result reports what makes a tool result unfit for a caller: its
// structured content and every content block are checked.
func Result(res *tool.Result) (string, bool) {
	if f, ok := JSON(res.Structured); ok {
		return f, true
	}
	for _, b := range res.Content {
		if f, ok := JSON(b); ok {
			return f, true
		}
	}
	return "", false
}

// Output is Result as an error: nil, or Withheld for what.
func Output(what string, res *tool.Result) error {
	if f, ok := Result(res); ok {
		return Withheld(what, f)
	}
	return nil
}

// JSON reports what makes one JSON document unfit for a caller. A
// document without any suspect bytes is clean without being parsed; one
// that has them and does not parse cannot be inspected, and is withheld.
func JSON(raw []byte) (string, bool) {
	if len(raw) == 0 || !suspect(raw) {
		return "", false
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "output that is not valid JSON and cannot be inspected", true
	}
	return walk(v, 0, false)
}

// Found reports whether JSON finds anything in raw.
func Found(raw []byte) bool {
	_, ok := JSON(raw)
	return ok
}

// Message reports what makes an upstream's error message unfit for a
// caller: everything JSON finds, and also "key=value" and "key: value"
// with a credential-like key in plain text (a false positive there costs
// only the wording of an error).
func Message(msg string) (string, bool) {
	if !suspect(msg) {
		return "", false
	}
	return text(msg, 0, true)
}

// CheckMessage is Message as an error: nil, or Withheld for what.
func CheckMessage(what, msg string) error {
	if f, ok := Message(msg); ok {
		return Withheld(what, f)
	}
	return nil
}

// walk looks for credential keys and token formats in a decoded value.
func walk(v any, depth int, bare bool) (string, bool) {
	if depth > MaxDepth {
		return fmt.Sprintf("values nested deeper than %d levels, which are not inspected", MaxDepth), true
	}
	switch v := v.(type) {
	case map[string]any:
		if k, x, ok := namedValue(v); ok && CredentialKey(k) && carries(k, x) {
			return keyFinding(k), true
		}
		for k, x := range v {
			if CredentialKey(k) && carries(k, x) {
				return keyFinding(k), true
			}
			if f, ok := walk(x, depth+1, bare); ok {
				return f, true
			}
		}
	case []any:
		for _, x := range v {
			if f, ok := walk(x, depth+1, bare); ok {
				return f, true
			}
		}
	case string:
		if suspect(v) {
			return text(v, depth+1, bare)
		}
	}
	return "", false
}

// text checks a string: as a JSON document when it is one, else for token
// formats and quoted credential keys ("access_token": ...) of JSON
// embedded in prose; bare key=value pairs too when bare is set.
func text(s string, depth int, bare bool) (string, bool) {
	t := strings.TrimSpace(s)
	if len(t) > 1 && (t[0] == '{' || t[0] == '[') {
		var v any
		if json.Unmarshal([]byte(t), &v) == nil {
			return walk(v, depth, bare)
		}
	}
	if f, ok := tokenFormat(s); ok {
		return f, true
	}
	if k, ok := textKey(s, bare); ok {
		return keyFinding(k), true
	}
	// A token percent-encoded (in a URL, say: eyJ...%2EeyJ...%2E...) is
	// the token all the same: look again at the decoded text, up to a
	// few layers of encoding.
	for range 3 {
		d := percentDecode(s)
		if d == s {
			break
		}
		if f, ok := tokenFormat(d); ok {
			return f + ", percent-encoded", true
		}
		s = d
	}
	return "", false
}

// percentDecode decodes every valid %XX in s and leaves the rest as it
// is, so that one bad escape cannot hide the others.
func percentDecode(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func keyFinding(k string) string {
	if len(k) > 64 {
		k = k[:64] + "…"
	}
	return fmt.Sprintf("a credential-like key (%s)", k)
}

// carries: only a boolean surely holds no secret ("hasPassword": true),
// and a number none under a weak key ("token": 3); anything else under a
// credential key is withheld, null and "" included.
func carries(k string, v any) bool {
	switch v.(type) {
	case bool:
		return false
	case float64:
		return !weakKey(k)
	}
	return true
}

// namedValue reads an object that names its value, as environment
// variables and tags are given ({"name": "DB_PASSWORD", "value": ...},
// {"Key": ..., "Value": ...}): the name is then the value's key.
func namedValue(m map[string]any) (key string, value any, ok bool) {
	if len(m) < 2 {
		return "", nil, false
	}
	var named, valued bool
	for k, x := range m {
		switch {
		case strings.EqualFold(k, "name") || strings.EqualFold(k, "key"):
			key, named = x.(string)
		case strings.EqualFold(k, "value"):
			value, valued = x, true
		}
	}
	return key, value, named && valued
}

// textKey finds key:value or key=value in prose with a credential-like key
// and a value that is not empty, null or a boolean. Unless bare, the key
// must be quoted as in JSON.
func textKey(s string, bare bool) (string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != ':' && s[i] != '=' {
			continue
		}
		// The key: a run of key bytes just before, after an optional quote.
		j := i
		for j > 0 && s[j-1] == ' ' {
			j--
		}
		quoted := j > 0 && (s[j-1] == '"' || s[j-1] == '\'')
		if quoted {
			j--
		}
		end := j
		for j > 0 && end-j < 64 && keyByte(s[j-1]) {
			j--
		}
		if j == end || (!bare && !(quoted && j > 0 && s[j-1] == s[end])) {
			continue
		}
		if !CredentialKey(s[j:end]) || !valueAfter(s[i+1:]) {
			continue
		}
		return s[j:end], true
	}
	return "", false
}

// keyWordByte: the bytes NormalizeKey keeps.
func keyWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// keyByte: the bytes of a key in prose, letters outside ASCII (their
// UTF-8 bytes) included, so that a confusable key is read whole.
func keyByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' || c >= 0x80
}

func valueAfter(s string) bool {
	s = strings.TrimLeft(s, " \t\"'")
	if s == "" {
		return false
	}
	for _, w := range []string{"null", "true", "false"} {
		if strings.HasPrefix(s, w) && (len(s) == len(w) || !keyByte(s[len(w)])) {
			return false
		}
	}
	c := s[0]
	return c != ',' && c != '}' && c != ']' && c != '\n' && c != ';' && c != '&'
}

// suspect is a sound, cheap prefilter: every credential key and token
// format contains one of these case-folded words (a key's with any
// separators between its letters, "pass_word"), a byte outside ASCII (a
// key may be spelled with confusable letters), a percent escape (a token
// may be encoded), or a \u escape that could spell one, so a document
// without any is clean unparsed.
func suspect[T string | []byte](b T) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c >= 0x80 {
			return true
		}
		if c == '\\' {
			if i+1 < len(b) && b[i+1] == 'u' {
				return true
			}
			continue
		}
		if c == '%' && i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]) {
			return true
		}
		rest := b[i:]
		switch c | 0x20 {
		case 't':
			if hasFoldSep(rest, "token") {
				return true
			}
		case 's':
			if hasFoldSep(rest, "secret") || hasFold(rest, "sk_live_") || hasFold(rest, "sk_test_") {
				return true
			}
		case 'c':
			if hasFoldSep(rest, "cookie") || hasFoldSep(rest, "credential") {
				return true
			}
		case 'a':
			if hasFoldSep(rest, "authoriz") || hasFold(rest, "akia") || hasFold(rest, "asia") || hasFold(rest, "aiza") {
				return true
			}
		case 'p':
			if hasFoldSep(rest, "passw") || hasFoldSep(rest, "passphrase") {
				return true
			}
		case 'k':
			if hasFold(rest, "key") && keyQualified(b[:i]) {
				return true
			}
		case 'b':
			if hasFoldSep(rest, "bearer") {
				return true
			}
		case 'j':
			if hasFoldSep(rest, "jwt") {
				return true
			}
		case 'g':
			if hasFold(rest, "github_pat_") || len(rest) > 3 && hasFold(rest, "gh") && rest[3] == '_' {
				return true
			}
		case 'x':
			if hasFold(rest, "xox") || hasFold(rest, "xapp-") {
				return true
			}
		case 'y':
			if hasFold(rest, "ya29.") {
				return true
			}
		case 'e':
			if hasFold(rest, "eyj") {
				return true
			}
		case 'r':
			if hasFold(rest, "rk_live_") || hasFold(rest, "rk_test_") {
				return true
			}
		}
	}
	return false
}

// keyQualified: "key" preceded, across any separators, by a word
// that makes it a credential (api key, private key, access key, secret
// key: the last caught by "secret" already).
func keyQualified[T string | []byte](before T) bool {
	for n := len(before); n > 0 && !keyWordByte(before[n-1]); n-- {
		before = before[:n-1]
	}
	for _, w := range []string{"api", "private", "access"} {
		if len(before) >= len(w) && hasFold(before[len(before)-len(w):], w) {
			return true
		}
	}
	return false
}

// hasFold reports whether b starts with lit (lower case), ASCII case
// folded, without allocating.
func hasFold[T string | []byte](b T, lit string) bool {
	if len(b) < len(lit) {
		return false
	}
	for i := 0; i < len(lit); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return false
		}
	}
	return true
}

// hasFoldSep is hasFold with any run of key separators (_ - . space)
// allowed between lit's letters, as NormalizeKey drops them.
func hasFoldSep[T string | []byte](b T, lit string) bool {
	j := 0
	for i := 0; i < len(lit); i++ {
		if i > 0 {
			for j < len(b) && (b[j] == '_' || b[j] == '-' || b[j] == '.' || b[j] == ' ') {
				j++
			}
		}
		if j >= len(b) {
			return false
		}
		c := b[j]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return false
		}
		j++
	}
	return true
}
