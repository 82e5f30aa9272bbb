package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// maxName is the longest tool name many MCP clients accept.
const maxName = 64

// ExposedName builds the name MCP clients see: <prefix>__<name>, or just
// the name when the prefix is empty. Characters outside [a-zA-Z0-9_-]
// become '_'; a result over 64 characters is cut and ends with a short hash
// of the whole, so it stays unique. It depends on nothing but its
// arguments, so adding another source never renames a tool.
func ExposedName(prefix, name string) string {
	full := name
	if prefix != "" {
		full = prefix + "__" + name
	}
	s := sanitize(full)
	if s == "" {
		s = "_"
	}
	if len(s) <= maxName {
		return s
	}
	sum := sha256.Sum256([]byte(full))
	suffix := "_" + hex.EncodeToString(sum[:])[:8]
	return s[:maxName-len(suffix)] + suffix
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
