package rawjson

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// names are the members the tests pick; the struct type below has them as
// fields, tagged, so that encoding/json matches keys to them by its own
// rules (case folding included).
var names = []string{"id", "method", "params", "io.x/y"}

var pickStruct = reflect.StructOf([]reflect.StructField{
	{Name: "A", Type: reflect.TypeFor[json.RawMessage](), Tag: `json:"id"`},
	{Name: "B", Type: reflect.TypeFor[json.RawMessage](), Tag: `json:"method"`},
	{Name: "C", Type: reflect.TypeFor[json.RawMessage](), Tag: `json:"params"`},
	{Name: "D", Type: reflect.TypeFor[json.RawMessage](), Tag: `json:"io.x/y"`},
})

var seeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__t_00","arguments":{}}}`,
	` { "id" : "a\"b" , "method":null, "params":[1,2.5e-3,-0,true,false,null,{"x":[]}] } `,
	`{}`, `{"id":1,"id":2}`, `{"ID":1}`, `{"Method":"x","method":"y"}`, `{"i\u0064":1}`,
	`{"\u00e9":1,"id":"é"}`, `{"id":"\ud800"}`, `{"id":"\u12G4"}`, `{"id":01}`, `{"id":1.}`,
	`{"id":1e}`, `{"id":-}`, `{"id":tru}`, `{"id":1,}`, `{,"id":1}`, `{"id" 1}`, `{"id":1}x`,
	`{"id":"a` + "\x01" + `"}`, `{"id":"` + "\xff" + `"}`, `[1,2]`, `"str"`, `1`, `{"id":[1,[2,[3]]]}`,
	`{"io.x/y":{"a":{"b":{}}}}`, `{"io.X/y":1}`, `{"id":1 , "method" : "m" }`, "{\"id\":1}\n",
	`{"id":"\/\b\f\n\r\t\\"}`, `{"id":"\x"}`, `{"k":1e+5,"id":-0.5E-7}`, `{"id":{"id":1}}`,
	strings.Repeat("[", 600) + strings.Repeat("]", 600), `{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
}

// check holds Pick, Elements and Valid to encoding/json on b.
func check(t *testing.T, b []byte) {
	t.Helper()
	if Valid(b) && !json.Valid(b) {
		t.Fatalf("Valid accepts %q, which encoding/json refuses", b)
	}
	vals := make([][]byte, len(names))
	picked := Pick(b, names, vals)
	// PickOthers reads as Pick does, and tells a member not in names.
	vals2 := make([][]byte, len(names))
	ok, others := PickOthers(b, names, vals2)
	if ok != picked || (ok && !reflect.DeepEqual(vals, vals2)) {
		t.Fatalf("PickOthers(%q) = %v %q, Pick = %v %q", b, ok, vals2, picked, vals)
	}
	if ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("PickOthers accepts %q, which encoding/json refuses: %v", b, err)
		}
		want := false
		for k := range m {
			want = want || !slices.Contains(names, k)
		}
		if others != want {
			t.Fatalf("PickOthers(%q): others = %v, want %v", b, others, want)
		}
	}
	if picked {
		v := reflect.New(pickStruct)
		if err := json.Unmarshal(b, v.Interface()); err != nil {
			t.Fatalf("Pick accepts %q, which encoding/json refuses: %v", b, err)
		}
		for i := range names {
			want := v.Elem().Field(i).Interface().(json.RawMessage)
			if !bytes.Equal(vals[i], want) {
				t.Fatalf("Pick(%q)[%s] = %q, encoding/json reads %q", b, names[i], vals[i], want)
			}
		}
	}
	var got []json.RawMessage
	if Elements(b, func(v []byte) { got = append(got, v) }) {
		var want []json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("Elements accepts %q, which encoding/json refuses: %v", b, err)
		}
		if len(got) != len(want) {
			t.Fatalf("Elements(%q) gives %d elements, encoding/json %d", b, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("Elements(%q)[%d] = %q, encoding/json reads %q", b, i, got[i], want[i])
			}
		}
	}
}

// TestAgainstEncodingJSON runs the seeds and many mutations of them
// (bytes flipped, cut, duplicated, case changed) through check.
func TestAgainstEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]:,"\ -+.0123456789eEtrufalsnIDdM/ubx` + "\x00\x1f\xc3\xa9\xff\n")
	for _, s := range seeds {
		check(t, []byte(s))
		for range 3000 {
			b := []byte(s)
			for range 1 + r.IntN(3) {
				if len(b) == 0 {
					break
				}
				i := r.IntN(len(b))
				switch r.IntN(4) {
				case 0:
					b[i] = alphabet[r.IntN(len(alphabet))]
				case 1:
					b = append(b[:i:i], b[i+1:]...)
				case 2:
					b = append(b[:i:i], append([]byte{alphabet[r.IntN(len(alphabet))]}, b[i:]...)...)
				case 3:
					j := i + r.IntN(len(b)-i)
					b = append(b[:j:j], append(bytes.Clone(b[i:j]), b[j:]...)...)
				}
			}
			check(t, b)
		}
	}
}

// The cases the package must refuse, although encoding/json reads them:
// its own reading might differ.
func TestPickRefusesWhatEncodingJSONReadsLoosely(t *testing.T) {
	for _, s := range []string{
		`{"id":1,"id":2}`,         // last one wins there
		`{"ID":1}`,                // case folded there
		`{"i\u0064":1}`,           // escape undone there
		`{"\u212a":1}`,            // Kelvin sign: folds to k there
		`{"id":"` + "\xff" + `"}`, // invalid UTF-8 replaced there
		`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
	} {
		if !json.Valid([]byte(s)) {
			t.Fatalf("%q: encoding/json refuses it; the case is meant to be one it reads", s)
		}
		if Pick([]byte(s), names, make([][]byte, len(names))) {
			t.Errorf("Pick accepts %q", s)
		}
	}
}

func TestPick(t *testing.T) {
	b := []byte(` {"jsonrpc":"2.0", "id" : "x1","other":{"id":9},"params":{"a":[1,{"b":null}]}} `)
	vals := make([][]byte, len(names))
	if !Pick(b, names, vals) {
		t.Fatal("Pick refused a valid object")
	}
	want := []string{`"x1"`, "", `{"a":[1,{"b":null}]}`, ""}
	for i, w := range want {
		if string(vals[i]) != w || (w == "") != (vals[i] == nil) {
			t.Errorf("%s = %q, want %q", names[i], vals[i], w)
		}
	}
}

func FuzzAgainstEncodingJSON(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { check(t, b) })
}

func BenchmarkPick(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"fx__t_00","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
	vals := make([][]byte, len(names))
	b.ReportAllocs()
	for b.Loop() {
		if !Pick(body, names, vals) {
			b.Fatal("refused")
		}
	}
}
