package router

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/capgate/capgate/tool"
)

// inputCorpus mixes plain objects (decodePlain's), inputs only the
// standard path reads, and invalid ones.
var inputCorpus = []string{
	``, `null`, `{}`, ` { } `, `{"message":"hello"}`, "\t{\"a\" :\r\n1 }\n",
	`{"a":1,"b":[1,2,{"c":null}],"d":{"e":true,"f":false}}`, `{"a":[]}`, `{"a":{}}`, `{"a":[[],[{}]]}`,
	`{"b":1,"a":2,"B":3,"":4,"aa":5}`, `{"a":1,"a":2}`, `{"a":{"x":1},"a":[2]}`,
	`{"n":0}`, `{"n":-0}`, `{"n":12.50}`, `{"n":1e5}`, `{"n":1E+5}`, `{"n":-1.25e-10}`, `{"n":123456789012345678901234567890}`,
	`{"n":01}`, `{"n":1.}`, `{"n":.5}`, `{"n":-}`, `{"n":1e}`, `{"n":1e+}`, `{"n":+1}`, `{"n":0x10}`, `{"n":1.5.5}`, `{"n":NaN}`,
	`{"s":"a\"b\\c\/d\be\ff\ng\rh\ti"}`, `{"s\n":"\\"}`, `{"s":"\u00e9\u2028\ud83d\ude00\ud800x\u0001"}`, `{"s":"\'"}`, `{"s":"\x"}`,
	`{"s":"é ü 日本 😀"}`, "{\"s\":\"\u2028\u2029\"}", `{"s":"<a href='x'>&amp;</a>"}`, "{\"s\":\"\x7f\"}",
	"{\"s\":\"\xff\"}", "{\"s\":\"a\x01b\"}", "{\"s\":\"\xe2\x80\"}", "{\"\xc3\":1}",
	`{"a":1}}`, `{"a":1}]`, `{"a":1} x`, `{"a":1}{}`, `{"a":1},`, `{"a":1`, `{"a"}`, `{"a":}`, `{,}`, `{"a":1,}`, `{a:1}`,
	`{"t":true,"f":false,"n":null}`, `{"t":tru}`, `{"t":truex}`, `{"n":nul}`, `{"t":TRUE}`,
	`[]`, `[{}]`, `"x"`, `1`, `true`, `nul`, `{"a":"b"`, `{"a":"b\`, `{"a":"b\"}`,
	"\u00a0{\"a\":1}\u0085", "{\"a\":1}\v", "\v{\"a\":1}",
	`{"a":[1,2,]}`, `{"a":[,1]}`, `{"a":[1 2]}`, `{"a" "b"}`,
	strings.Repeat(`{"a":`, 70) + `1` + strings.Repeat(`}`, 70),
	strings.Repeat(`{"a":[`, 30) + `1` + strings.Repeat(`]}`, 30),
	`{"html":"<>&","keys":{"<":1,"&":2,">":3}}`,
}

// standardInput is parseInput's reference: encoding/json, then what it
// is lenient about refused by an independent check (duplicateKey,
// badUnicode), and the canonical form from json.Marshal.
func standardInput(raw json.RawMessage) (json.RawMessage, any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, errors.New("input is not valid JSON: " + err.Error())
	}
	// More would let a closing bracket through: {"a":1}] is not one object.
	if len(bytes.Trim(raw[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, nil, errors.New("input has data after its JSON object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, nil, errors.New("input must be a JSON object")
	}
	if duplicateKey(raw) || badUnicode(raw) {
		return nil, nil, errStrict
	}
	canon, err := json.Marshal(v)
	if err != nil {
		return nil, nil, err
	}
	return canon, v, nil
}

// errStrict stands for the refusals of strictScan, whose words the
// reference does not repeat.
var errStrict = errors.New("strict")

// duplicateKey walks valid JSON with encoding/json's tokens and reports a
// key repeated in one object.
func duplicateKey(raw []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(raw))
	type level struct {
		keys   map[string]bool
		object bool
		atKey  bool
	}
	var stack []*level
	for {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.atKey {
			if k, ok := t.(string); ok {
				if top.keys[k] {
					return true
				}
				top.keys[k] = true
				top.atKey = false
				continue
			}
		}
		switch t {
		case json.Delim('{'):
			stack = append(stack, &level{keys: map[string]bool{}, object: true, atKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].atKey = true // a value ended
		}
	}
}

// badUnicode reports raw bytes that are not UTF-8, or a \u escape of a
// surrogate that is not half of a pair.
func badUnicode(raw []byte) bool {
	if !utf8.Valid(raw) {
		return true
	}
	s := string(raw)
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if s[i+1] != 'u' {
			i++ // another escape, \\ among them
			continue
		}
		r, err := strconv.ParseUint(s[i+2:i+6], 16, 32)
		if err != nil {
			return false
		}
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if i+12 > len(s) || s[i+6:i+8] != "\\u" {
				return true
			}
			r2, err := strconv.ParseUint(s[i+8:i+12], 16, 32)
			if err != nil || r2 < 0xdc00 || r2 >= 0xe000 {
				return true
			}
			i += 11
		case r >= 0xdc00 && r < 0xe000:
			return true
		default:
			i += 5
		}
	}
	return false
}

// checkInput: parseInput answers as the reference does, gives the tool
// the canonical bytes and hashes exactly those.
func checkInput(t *testing.T, in string) {
	t.Helper()
	input, v, hash, err := parseInput(json.RawMessage(in))
	canon, want, wantErr := standardInput(json.RawMessage(in))
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("%q: error %v, want %v", in, err, wantErr)
	case err != nil:
		var te *tool.Error
		if !errors.As(err, &te) || te.Code != tool.CodeInvalidInput || te.Gate != GateInput ||
			(wantErr != errStrict && te.Message != wantErr.Error()) {
			t.Fatalf("%q: error %#v, want %q", in, err, wantErr)
		}
		return
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("%q: decoded %#v, want %#v", in, v, want)
	}
	if !bytes.Equal(input, canon) {
		t.Fatalf("%q: the tool would get %q, want json.Marshal's %q", in, input, canon)
	}
	sum := sha256.Sum256(canon)
	if want := hex.EncodeToString(sum[:]); hash != want {
		t.Fatalf("%q: hash %s, want %s", in, hash, want)
	}
}

func TestInputIsStandard(t *testing.T) {
	for _, in := range inputCorpus {
		checkInput(t, in)
	}
	// Plain objects must take the fast path, or it is not worth having.
	for _, in := range []string{`{}`, `{"message":"hello"}`, `{"a":[1,{"b":null}],"s":"x\ny é"}`} {
		if _, ok := decodePlain([]byte(in)); !ok {
			t.Errorf("decodePlain(%s) said no", in)
		}
	}
	// Random edits of the corpus reach the corners between valid and not.
	rng := rand.New(rand.NewPCG(7, 11))
	alphabet := []byte("{}[]\":,\\/ \t\n0123456789-+.eEtrufalsn\x00\x7f\xc3\xa9\xe2\x80\xa8<&ab")
	for range 20000 {
		b := []byte(inputCorpus[rng.IntN(len(inputCorpus))])
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(b) + 1)
			c := alphabet[rng.IntN(len(alphabet))]
			switch rng.IntN(3) {
			case 0:
				b = append(b[:i], append([]byte{c}, b[i:]...)...)
			case 1:
				if i < len(b) {
					b = append(b[:i], b[i+1:]...)
				}
			default:
				if i < len(b) {
					b[i] = c
				}
			}
		}
		checkInput(t, string(b))
	}
}

func FuzzInput(f *testing.F) {
	for _, in := range inputCorpus {
		f.Add(in)
	}
	f.Fuzz(checkInput)
}

// TestInputRefusesWhatDecodersReadOtherwise: a repeated key at any depth
// and strings that are not valid Unicode are refused, naming where.
func TestInputRefusesWhatDecodersReadOtherwise(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"cmd":"rm -rf /","cmd":"ls"}`, `input repeats the key "cmd" in $: refused`},
		{`{"a":{"b":[1,{"x":1,"y":2,"x":3}]}}`, `input repeats the key "x" in $.a.b[1]: refused`},
		{`{"a":1,"\u0061":2}`, `input repeats the key "a" in $`},
		{`{"weird key":{"k":1,"k":1}}`, `input repeats the key "k" in $["weird key"]`},
		{"{\"a\":[\"ok\",\"\xff\"]}", `input has invalid UTF-8 (byte 0xff at offset 12) in a string in $.a[1]`},
		{"{\"\xc3\":1}", `input has invalid UTF-8 (byte 0xc3 at offset 2) in a string in $`},
		{`{"a":{"s":"\ud800x"}}`, `input has a lone UTF-16 surrogate (\ud800) in a string in $.a.s`},
		{`{"s":"\udc00"}`, `input has a lone UTF-16 surrogate (\udc00) in a string in $.s`},
	} {
		_, _, _, err := parseInput(json.RawMessage(tt.in))
		var te *tool.Error
		if !errors.As(err, &te) || te.Code != tool.CodeInvalidInput || te.Gate != GateInput || !strings.HasPrefix(te.Message, tt.want) {
			t.Errorf("%q: %v, want %s…", tt.in, err, tt.want)
		}
	}
	// A valid pair is one character; keys differing only in case are two.
	for _, in := range []string{`{"s":"\ud83d\ude00"}`, `{"a":1,"A":2}`, `{"a":{"x":1},"b":{"x":1}}`} {
		if _, _, _, err := parseInput(json.RawMessage(in)); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}
