package router

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// strictScan walks JSON that encoding/json has accepted and finds what it
// was lenient about, which other decoders read otherwise: a key repeated
// in one object, and strings that are not valid Unicode. It names where,
// as a path from the input's root ($).
type strictScan struct {
	b    []byte
	i    int
	path []string // one segment per level: .key, ["key"] or [index]
}

// value checks the value at s.i and returns what is wrong, or "".
func (s *strictScan) value() string {
	s.space()
	if s.i >= len(s.b) {
		return ""
	}
	switch s.b[s.i] {
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		_, msg := s.str()
		return msg
	}
	// A number or a literal: valid already, skip to its end.
	for s.i < len(s.b) && !strings.ContainsRune(",}] \t\r\n", rune(s.b[s.i])) {
		s.i++
	}
	return ""
}

func (s *strictScan) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\r' || s.b[s.i] == '\n') {
		s.i++
	}
}

func (s *strictScan) object() string {
	s.i++ // '{'
	seen := map[string]struct{}{}
	for {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] == '}' {
			s.i++
			return ""
		}
		if s.b[s.i] == ',' {
			s.i++
			continue
		}
		key, msg := s.str()
		if msg != "" {
			return msg
		}
		if _, dup := seen[key]; dup {
			return fmt.Sprintf("repeats the key %s in %s: refused, since decoders disagree on which one counts",
				quoteKey(key), s.where())
		}
		seen[key] = struct{}{}
		s.space()
		s.i++ // ':'
		s.path = append(s.path, keySegment(key))
		if msg := s.value(); msg != "" {
			return msg
		}
		s.path = s.path[:len(s.path)-1]
	}
}

func (s *strictScan) array() string {
	s.i++ // '['
	for n := 0; ; n++ {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] == ']' {
			s.i++
			return ""
		}
		if s.b[s.i] == ',' {
			s.i++
			s.space()
		}
		s.path = append(s.path, "["+strconv.Itoa(n)+"]")
		if msg := s.value(); msg != "" {
			return msg
		}
		s.path = s.path[:len(s.path)-1]
	}
}

// str reads the string at s.i and returns it decoded, or what is wrong
// with it.
func (s *strictScan) str() (string, string) {
	s.i++ // '"'
	var out []byte
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return string(out), ""
		case c == '\\' && s.i+1 < len(s.b) && s.b[s.i+1] == 'u':
			r, ok := s.hex4(s.i + 2)
			s.i += 6
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if r < 0xdc00 && s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
					r2, ok2 = s.hex4(s.i + 2)
				}
				pair := utf16.DecodeRune(r, r2)
				if !ok2 || pair == utf8.RuneError {
					return "", fmt.Sprintf("has a lone UTF-16 surrogate (\\u%04x) in a string in %s: strings must be valid Unicode", r, s.where())
				}
				s.i += 6
				r = pair
			}
			if ok {
				out = utf8.AppendRune(out, r)
			}
		case c == '\\' && s.i+1 < len(s.b):
			out = append(out, unescaped[s.b[s.i+1]])
			s.i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			s.i++
		default:
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size == 1 {
				return "", fmt.Sprintf("has invalid UTF-8 (byte 0x%02x at offset %d) in a string in %s", c, s.i, s.where())
			}
			out = append(out, s.b[s.i:s.i+size]...)
			s.i += size
		}
	}
	return string(out), ""
}

// hex4 reads the four hex digits of a \u escape at i.
func (s *strictScan) hex4(i int) (rune, bool) {
	if i+4 > len(s.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s.b[i:i+4]), 16, 32)
	return rune(n), err == nil
}

// where is the current path, $ for the root object.
func (s *strictScan) where() string {
	return "$" + strings.Join(s.path, "")
}

// keySegment is a path segment for key: .key when it reads plainly,
// else ["key"].
func keySegment(key string) string {
	plain := key != "" && len(key) <= 64
	for i := 0; plain && i < len(key); i++ {
		c := key[i]
		plain = c == '_' || c == '-' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
	}
	if plain {
		return "." + key
	}
	return "[" + quoteKey(key) + "]"
}
