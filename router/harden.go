package router

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/capgate/capgate/tool"
)

// credentialKeys are the keys a tool's output must never hold, at any
// depth: compared trimmed, case-folded, with '-' read as '_'.
var credentialKeys = map[string]bool{
	"access_token": true, "refresh_token": true, "id_token": true, "client_secret": true,
	"cookie": true, "cookies": true, "authorization": true, "set_cookie": true,
}

// suspects are what every credential key contains, folded; an output
// without any of them (and without escapes that could spell them) is
// clean without being parsed.
var suspects = [][]byte{[]byte("token"), []byte("secret"), []byte("cookie"), []byte("authorization"), []byte(`\u`)}

// credentialKey reports the first credential-like key in a result: in its
// structured content, in its content blocks, and in JSON carried inside
// their strings (a text block holding a JSON document).
func credentialKey(res *tool.Result) (string, bool) {
	if k, ok := scanJSON(res.Structured); ok {
		return k, true
	}
	for _, b := range res.Content {
		if k, ok := scanJSON(b); ok {
			return k, true
		}
	}
	return "", false
}

func scanJSON(raw []byte) (string, bool) {
	if len(raw) == 0 || !mayHoldCredential(raw) {
		return "", false
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		// Not JSON (a text block): nothing has keys.
		return "", false
	}
	return walk(v, 0)
}

func mayHoldCredential(b []byte) bool {
	for _, s := range suspects {
		if containsFold(b, s) {
			return true
		}
	}
	return false
}

// containsFold is bytes.Contains with ASCII case folding, without
// allocating; sub is lower case.
func containsFold(b, sub []byte) bool {
	first := sub[0]
	for i := 0; i+len(sub) <= len(b); i++ {
		if b[i]|0x20 != first && b[i] != first {
			continue
		}
		j := 1
		for ; j < len(sub); j++ {
			c := b[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				break
			}
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}

// walk looks for credential keys in a decoded value, and in strings that
// are themselves JSON documents, to a bounded depth.
func walk(v any, depth int) (string, bool) {
	if depth > 64 {
		return "", false
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if credentialKeys[normalizeKey(k)] {
				return k, true
			}
			if k, ok := walk(x, depth+1); ok {
				return k, true
			}
		}
	case []any:
		for _, x := range v {
			if k, ok := walk(x, depth+1); ok {
				return k, true
			}
		}
	case string:
		s := bytes.TrimSpace([]byte(v))
		if len(s) > 1 && (s[0] == '{' || s[0] == '[') {
			return scanJSON(s)
		}
	}
	return "", false
}

func normalizeKey(k string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(k)), "-", "_")
}
