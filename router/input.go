package router

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/tool"
)

// parseInput reads the input once and returns what the tool will run
// with: its canonical bytes (keys sorted, no spaces, json.Marshal's
// escapes), the decoded value for schema validation (numbers kept exact,
// as json.Number) and the hash of those very bytes, which approvals and
// idempotency records bind to. The tool gets the canonical bytes, never
// the client's: what was approved is what runs, whichever way the tool's
// own decoder would have read the original.
//
// Input that decoders read differently is refused: a key repeated in one
// object (encoding/json keeps the last, others the first) and strings
// that are not valid Unicode (raw invalid UTF-8, lone surrogate escapes),
// which decoders replace, refuse or keep.
func parseInput(raw json.RawMessage) (json.RawMessage, any, string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = json.RawMessage("{}")
	}
	// A plain object, the usual input, is read without a json.Decoder and
	// the buffers it allocates; anything else takes the standard path,
	// which alone words the errors.
	v, ok := decodePlain(raw)
	if !ok {
		var err error
		if v, err = decodeStandard(raw); err != nil {
			return nil, nil, "", err
		}
	}
	if m, ok := v.(map[string]any); ok && len(m) == 0 {
		return emptyInput, v, emptyInputHash, nil
	}
	var buf [512]byte
	canon := appendCanonical(buf[:0], v)
	hash := audit.HashInput(canon)
	if bytes.Equal(canon, raw) {
		// Already canonical (a client that sends what capgate would):
		// the same bytes, without a copy.
		return raw, v, hash, nil
	}
	return bytes.Clone(canon), v, hash, nil
}

// emptyInput is the canonical form of every empty input.
var emptyInput = json.RawMessage("{}")

// decodeStandard reads raw with encoding/json, then checks what it is
// lenient about (see strictScan).
func decodeStandard(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "input is not valid JSON: " + err.Error()}
	}
	// More would let a closing bracket through: {"a":1}] is not one object.
	if len(bytes.Trim(raw[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "input has data after its JSON object"}
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "input must be a JSON object"}
	}
	s := strictScan{b: raw}
	if msg := s.value(); msg != "" {
		return nil, &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "input " + msg,
			Hint: "send each key once per object, and strings of valid UTF-8"}
	}
	return v, nil
}

// plainDepth is how deep decodePlain follows nested objects and arrays.
const plainDepth = 64

// decodePlain decodes raw as the standard path would when raw is exactly
// one JSON object, nested at most plainDepth deep, whose strings are valid
// UTF-8 without \u escapes. To anything else, valid or not, it says no,
// and the standard path decides.
func decodePlain(raw []byte) (any, bool) {
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	p := plainReader{b: raw}
	v, ok := p.value()
	p.space()
	return v, ok && p.i == len(p.b)
}

type plainReader struct {
	b     []byte
	i     int
	depth int
}

func (p *plainReader) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *plainReader) value() (any, bool) {
	p.space()
	if p.i == len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		return p.quoted()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	}
	return nil, false
}

// object reads an object. A repeated key is left to the standard path,
// which refuses it naming where.
func (p *plainReader) object() (any, bool) {
	if p.depth++; p.depth > plainDepth {
		return nil, false
	}
	p.i++ // '{'
	m := map[string]any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		p.depth--
		return m, true
	}
	for {
		p.space()
		if p.i == len(p.b) || p.b[p.i] != '"' {
			return nil, false
		}
		k, ok := p.quoted()
		if !ok {
			return nil, false
		}
		p.space()
		if p.i == len(p.b) || p.b[p.i] != ':' {
			return nil, false
		}
		p.i++
		if _, dup := m[k]; dup {
			return nil, false
		}
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		m[k] = v
		more, ok := p.next('}')
		if !ok {
			return nil, false
		}
		if !more {
			return m, true
		}
	}
}

func (p *plainReader) array() (any, bool) {
	if p.depth++; p.depth > plainDepth {
		return nil, false
	}
	p.i++ // '['
	a := make([]any, 0)
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		p.depth--
		return a, true
	}
	for {
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		a = append(a, v)
		more, ok := p.next(']')
		if !ok {
			return nil, false
		}
		if !more {
			return a, true
		}
	}
}

// next reads what follows a member or an element: a comma (more to come)
// or the closing bracket, which ends the object or array.
func (p *plainReader) next(close byte) (more, ok bool) {
	p.space()
	if p.i == len(p.b) {
		return false, false
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		return true, true
	case close:
		p.i++
		p.depth--
		return false, true
	}
	return false, false
}

// quoted reads a string whose escapes, if any, are the one-letter ones.
func (p *plainReader) quoted() (string, bool) {
	start, escapes := p.i+1, false
	j := start
	for {
		if j == len(p.b) {
			return "", false
		}
		c := p.b[j]
		switch {
		case c == '"':
			p.i = j + 1
			if !escapes {
				return string(p.b[start:j]), true
			}
			return unescape(p.b[start:j]), true
		case c == '\\':
			if j+1 == len(p.b) || unescaped[p.b[j+1]] == 0 {
				return "", false
			}
			escapes = true
			j += 2
		case c < 0x20:
			return "", false
		case c < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(p.b[j:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			j += size
		}
	}
}

// unescaped maps the letter of a one-letter escape to its byte; 0 for the
// rest (\u is left to the standard path).
var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unescape decodes the inside of a string that quoted has checked.
func unescape(b []byte) string {
	var s strings.Builder
	s.Grow(len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' {
			i++
			s.WriteByte(unescaped[b[i]])
			continue
		}
		s.WriteByte(b[i])
	}
	return s.String()
}

func (p *plainReader) literal(word string) bool {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return false
	}
	p.i += len(word)
	return true
}

// number reads a number as JSON's grammar has it, kept as written.
func (p *plainReader) number() (any, bool) {
	end, ok := rawjson.Number(p.b, p.i)
	if !ok {
		return nil, false
	}
	n := json.Number(p.b[p.i:end])
	p.i = end
	return n, true
}

// emptyInputHash is the hash of every empty input.
var emptyInputHash = audit.HashInput(emptyInput)

// appendCanonical appends the input with sorted keys and no spaces, so an
// approval or idempotency key binds to the input, not to how a client
// spaced it. The bytes are json.Marshal's, for every value parseInput
// makes, without the reflection and allocations of json.Marshal.
func appendCanonical(b []byte, v any) []byte {
	switch v := v.(type) {
	case map[string]any:
		var kb [16]string
		keys := kb[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = rawjson.AppendString(b, k)
			b = append(b, ':')
			b = appendCanonical(b, v[k])
		}
		return append(b, '}')
	case []any:
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonical(b, x)
		}
		return append(b, ']')
	case string:
		return rawjson.AppendString(b, v)
	case json.Number:
		return append(b, v...)
	case bool:
		return strconv.AppendBool(b, v)
	case nil:
		return append(b, "null"...)
	}
	// parseInput makes no other type; should one appear, it is encoded
	// as json.Marshal would.
	m, _ := json.Marshal(v)
	return append(b, m...)
}
