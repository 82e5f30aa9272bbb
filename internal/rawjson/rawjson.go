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

import (
	"encoding/json"
	"unicode/utf8"
)

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
	end, ok := object(b, i, 1, func(key, v []byte) bool { return match(key, names, vals, v) })
	return ok && skipSpace(b, end) == len(b)
}

// PickOthers is Pick, and also says whether b has a member not in names
// (others), for a caller that must know every member to act on b.
func PickOthers(b []byte, names []string, vals [][]byte) (ok, others bool) {
	clear(vals)
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false, false
	}
	end, ok := object(b, i, 1, func(key, v []byte) bool {
		known, ok := matchKnown(key, names, vals, v)
		others = others || !known
		return ok
	})
	return ok && skipSpace(b, end) == len(b), others
}

// match records v under key when key is one of names; false when key is
// a name twice, or could be one by encoding/json's looser matching.
func match(key []byte, names []string, vals [][]byte, v []byte) bool {
	_, ok := matchKnown(key, names, vals, v)
	return ok
}

// matchKnown is match, and says whether key is one of names.
func matchKnown(key []byte, names []string, vals [][]byte, v []byte) (known, ok bool) {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false, false
		}
	}
	for j, name := range names {
		switch {
		case string(key) == name:
			if vals[j] != nil {
				return true, false
			}
			vals[j] = v
			return true, true
		case equalFoldASCII(key, name):
			return false, false
		}
	}
	return false, true
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
	end, ok := array(b, i, 1, f)
	return ok && skipSpace(b, end) == len(b)
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
		return object(b, i, depth+1, nil)
	case c == '[':
		return array(b, i, depth+1, nil)
	case c == '-' || '0' <= c && c <= '9':
		return Number(b, i)
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

// object scans the object at b[i:], at nesting depth, calling member (if
// not nil) with each key, as written inside its quotes, and value; false
// from member refuses the object.
func object(b []byte, i, depth int, member func(key, v []byte) bool) (int, bool) {
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
		keyEnd, ok := str(b, i)
		if !ok {
			return i, false
		}
		key := b[i+1 : keyEnd-1]
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		start := skipSpace(b, i+1)
		if i, ok = value(b, start, depth); !ok {
			return i, false
		}
		if member != nil && !member(key, b[start:i]) {
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

// array scans the array at b[i:], at nesting depth, calling elem (if not
// nil) with each element.
func array(b []byte, i, depth int, elem func(v []byte)) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		end, ok := value(b, i, depth)
		if !ok {
			return end, false
		}
		if elem != nil {
			elem(b[i:end])
		}
		i = skipSpace(b, end)
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

// Number scans the number at b[i:], -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?,
// and returns where it ends.
func Number(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
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

// AppendString appends s quoted as json.Marshal quotes it. Names and keys
// are nearly always plain ASCII, which needs no escaping; anything else
// goes to json.Marshal.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
