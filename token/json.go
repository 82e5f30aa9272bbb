package token

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A small reader for the flat JSON objects of token headers and payloads.
// It runs only on text that json.Valid accepted, so it need not handle
// syntax errors; it matches keys exactly (encoding/json matches struct
// fields case-insensitively, Python does not) and returns substrings of its
// input instead of allocating.

// members iterates the members of a JSON object.
type members struct {
	s string
	i int
}

// newMembers starts iterating s, which must be valid JSON. ok is false when
// s is not an object.
func newMembers(s string) (members, bool) {
	i := skipWS(s, 0)
	if i >= len(s) || s[i] != '{' {
		return members{}, false
	}
	return members{s: s, i: i + 1}, true
}

// next returns the next member: its key, quotes included and escapes not
// decoded (compare it with keyIs), and its value's raw text.
func (m *members) next() (key, val string, ok bool) {
	s := m.s
	i := skipWS(s, m.i)
	if i < len(s) && s[i] == ',' {
		i = skipWS(s, i+1)
	}
	if i >= len(s) || s[i] != '"' {
		return "", "", false
	}
	end := stringEnd(s, i)
	key = s[i:end]
	i = skipWS(s, end)
	if i >= len(s) || s[i] != ':' {
		return "", "", false
	}
	i = skipWS(s, i+1)
	vend := valueEnd(s, i)
	m.i = vend
	return key, s[i:vend], true
}

// keyName returns a raw key's name, decoding escapes when it has any.
func keyName(raw string) string {
	if strings.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	var k string
	if json.Unmarshal([]byte(raw), &k) != nil {
		return ""
	}
	return k
}

// elements iterates the elements of a JSON array.
type elements struct {
	s string
	i int
}

func newElements(s string) (elements, bool) {
	if s == "" || s[0] != '[' {
		return elements{}, false
	}
	return elements{s: s, i: 1}, true
}

func (e *elements) next() (val string, ok bool) {
	s := e.s
	i := skipWS(s, e.i)
	if i < len(s) && s[i] == ',' {
		i = skipWS(s, i+1)
	}
	if i >= len(s) || s[i] == ']' {
		return "", false
	}
	end := valueEnd(s, i)
	e.i = end
	return s[i:end], true
}

func skipWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just after the string starting at s[i].
func stringEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(s)
}

// valueEnd returns the index just after the value starting at s[i].
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(s); {
			switch s[j] {
			case '"':
				j = stringEnd(s, j)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
			j++
		}
		return len(s)
	default: // number, true, false, null
		j := i
		for j < len(s) {
			switch s[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
			j++
		}
		return j
	}
}

// jsonString decodes a JSON string value. ok is false when val is not a
// string or is not valid UTF-8.
func jsonString(val string) (string, bool) {
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	inner := val[1 : len(val)-1]
	if strings.IndexByte(inner, '\\') < 0 {
		if !utf8.ValidString(inner) {
			return "", false
		}
		return inner, true
	}
	if !utf8.ValidString(inner) {
		return "", false
	}
	var out string
	if json.Unmarshal([]byte(val), &out) != nil {
		return "", false
	}
	return out, true
}

// jsonStrings decodes an array of strings. ok is false when val is not an
// array or an element is not a string.
func jsonStrings(val string) ([]string, bool) {
	it, ok := newElements(val)
	if !ok {
		return nil, false
	}
	n := 0
	for count := it; ; n++ {
		if _, more := count.next(); !more {
			break
		}
	}
	out := make([]string, 0, n)
	for {
		v, more := it.next()
		if !more {
			return out, true
		}
		s, ok := jsonString(v)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
}

// maxNumericDate bounds a NumericDate (seconds since 1970): about year 33658.
const maxNumericDate = 1e12

// jsonSeconds decodes a NumericDate: an integer or a fraction of seconds
// since 1970. ok is false for anything else.
func jsonSeconds(val string) (sec, nsec int64, ok bool) {
	if val == "" || (val[0] != '-' && (val[0] < '0' || val[0] > '9')) {
		return 0, 0, false
	}
	if strings.IndexAny(val, ".eE") < 0 {
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n > maxNumericDate || n < -maxNumericDate {
			return 0, 0, false
		}
		return n, 0, true
	}
	f, err := strconv.ParseFloat(val, 64)
	if err != nil || math.IsNaN(f) || f > maxNumericDate || f < -maxNumericDate {
		return 0, 0, false
	}
	whole, frac := math.Modf(f)
	return int64(whole), int64(frac * 1e9), true
}

// appendPyString appends s as Python's json.dumps writes a str with its
// default ensure_ascii=True: \" \\ \b \f \n \r \t, every other character
// outside ' '..'~' as \u00xx (lower-case hex), non-BMP characters as a
// surrogate pair. '<', '>' and '&' stay as they are. s must be valid UTF-8.
func appendPyString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	u4 := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r >= ' ' && r <= '~':
			b = append(b, byte(r))
		case r < 0x10000:
			b = u4(b, r)
		default:
			r -= 0x10000
			b = u4(b, 0xd800|(r>>10)&0x3ff)
			b = u4(b, 0xdc00|r&0x3ff)
		}
	}
	return append(b, '"')
}
