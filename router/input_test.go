package router

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

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

// standardInput is parseInput without decodePlain: the reference.
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
	if dec.More() {
		return nil, nil, errors.New("input has data after its JSON object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, nil, errors.New("input must be a JSON object")
	}
	return raw, v, nil
}

// checkInput: parseInput and hashInput answer exactly as the standard
// decoder and json.Marshal do.
func checkInput(t *testing.T, in string) {
	t.Helper()
	raw, v, err := parseInput(json.RawMessage(in))
	wantRaw, want, wantErr := standardInput(json.RawMessage(in))
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("%q: error %v, want %v", in, err, wantErr)
	case err != nil:
		var te *tool.Error
		if !errors.As(err, &te) || te.Message != wantErr.Error() || te.Code != tool.CodeInvalidInput || te.Gate != GateInput {
			t.Fatalf("%q: error %#v, want %q", in, err, wantErr)
		}
		return
	}
	if !bytes.Equal(raw, wantRaw) {
		t.Fatalf("%q: input %q, want %q", in, raw, wantRaw)
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("%q: decoded %#v, want %#v", in, v, want)
	}
	canon, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendCanonical(nil, v); !bytes.Equal(got, canon) {
		t.Fatalf("%q: canonical %q, want json.Marshal's %q", in, got, canon)
	}
	sum := sha256.Sum256(canon)
	if got, want := hashInput(v), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("%q: hash %s, want %s", in, got, want)
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
