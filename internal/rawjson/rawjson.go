// Package rawjson picks members out of JSON objects without decoding
// them: a validating scan, no reflection, no copies. It serves the hot
// path, where encoding/json's reflection and its copies of every raw
// value cost more than the rest of the work.
//
// It is never more lenient than encoding/json: what it accepts,
// encoding/json accepts and reads the same way. Where encoding/json would
// read a document by rules this package does not follow (a key with an
// escape or a non-ASCII byte, a key that differs from a wanted name only in
// case, a wanted name twice, invalid UTF-8, very deep nesting), it says
// no, and the caller falls back to encoding/json.
package rawjson

import "unicode/utf8"

// maxDepth bounds nesting; deeper documents are refused (encoding/json
// allows 10000).
const maxDepth = 512

// Pick checks that b is one valid JSON object (with white space around it
// allowed) and puts in vals[i] the value of its member named names[i], as
// written, or nil when there is none. Other members are skipped. It says
// no when b is not a valid object, or when a key could match one of names
// otherwise than exactly (see the package doc); vals is then undefined.
func Pick(b []byte, names []string, vals [][]byte) bool {
	clear(vals)
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end, ok := str(b, i)
		if !ok {
			return false
		}
		key := b[i+1 : end-1]
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		start := skipSpace(b, i+1)
		if i, ok = value(b, start, 1); !ok {
			return false
		}
		if !match(key, names, vals, b[start:i]) {
			return false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// match records v under key when key is one of names; false when key is
// a name twice, or could be one by encoding/json's looser matching.
func match(key []byte, names []string, vals [][]byte, v []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	for j, name := range names {
		switch {
		case string(key) == name:
			if vals[j] != nil {
				return false
			}
			vals[j] = v
			return true
		case equalFoldASCII(key, name):
			return false
		}
	}
	return true
}

func equalFoldASCII(a []byte, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// Elements checks that b is one valid JSON array and calls f with each
// element, as written, in order.
func Elements(b []byte, f func(v []byte)) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		end, ok := value(b, i, 1)
		if !ok {
			return false
		}
		f(b[i:end])
		i = skipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// Valid reports whether b is one JSON value, with white space around it
// allowed.
func Valid(b []byte) bool {
	end, ok := value(b, skipSpace(b, 0), 0)
	return ok && skipSpace(b, end) == len(b)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value scans the value at b[i:] and returns where it ends.
func value(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return str(b, i)
	case c == '{':
		return object(b, i, depth+1)
	case c == '[':
		return array(b, i, depth+1)
	case c == '-' || '0' <= c && c <= '9':
		return number(b, i)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	}
	return i, false
}

func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

func object(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		var ok bool
		if i, ok = str(b, i); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		if i, ok = value(b, skipSpace(b, i+1), depth); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}

func array(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = value(b, i, depth); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// str scans the string at b[i:], which starts with a quote: no control
// characters, valid escapes, valid UTF-8.
func str(b []byte, i int) (int, bool) {
	i++
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, true
		case c < ' ':
			return i, false
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !hex(b[i+2]) || !hex(b[i+3]) || !hex(b[i+4]) || !hex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, false
			}
			i += n
		}
	}
	return i, false
}

func hex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func number(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
