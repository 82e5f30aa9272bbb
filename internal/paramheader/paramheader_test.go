package paramheader

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// TestValid: what mcp-go checks (token, unique, primitive type) and an
// annotation off the properties chain, which mcp-go ignores.
func TestValid(t *testing.T) {
	for _, tc := range []struct {
		schema, why string // why "" is valid
	}{
		{`{"type":"object"}`, ""},
		{`{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"Region"},"n":{"type":"integer","x-mcp-header":"N"},"b":{"type":"boolean","x-mcp-header":"B"}}}`, ""},
		{`{"type":"object","properties":{"o":{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"Region"}}}}}`, ""},
		// A property named x-mcp-header is a name, not an annotation.
		{`{"type":"object","properties":{"x-mcp-header":{"type":"string"}}}`, ""},
		// Instances, not schemas: an object value with the key annotates nothing.
		{`{"type":"object","properties":{"o":{"type":"object","default":{"x-mcp-header":"X"},"examples":[{"x-mcp-header":"Y"}]}},"const":{"x-mcp-header":"Z"},"enum":[{"x-mcp-header":"W"}]}`, ""},
		{`{"type":"object","properties":{"default":{"type":"string","x-mcp-header":"D"}}}`, ""},
		{`{"type":"object","properties":{"r":{"type":"string","x-mcp-header":""}}}`, "non-empty"},
		{`{"type":"object","properties":{"r":{"type":"number","x-mcp-header":"R"}}}`, `got "number"`},
		{`{"type":"object","properties":{"r":{"x-mcp-header":"R"}}}`, "no declared type"},
		{`{"type":"object","properties":{"a":{"type":"string","x-mcp-header":"R"},"b":{"type":"string","x-mcp-header":"r"}}}`, "duplicate"},
		{`{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"A B"}}}`, "invalid character"},
		{`{"type":"object","x-mcp-header":"Root"}`, "the root"},
		{`{"type":"array","items":{"type":"string","x-mcp-header":"Item"}}`, "items"},
		{`{"type":"object","properties":{"a":{"type":"array","items":{"type":"string","x-mcp-header":"Item"}}}}`, "a.items"},
		{`{"type":"object","oneOf":[{"properties":{"r":{"type":"string","x-mcp-header":"R"}}}]}`, "oneOf[0].r"},
		{`{"type":"object","$defs":{"r":{"type":"string","x-mcp-header":"R"}},"properties":{"r":{"$ref":"#/$defs/r"}}}`, "$defs.r"},
	} {
		err := Valid(json.RawMessage(tc.schema))
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.schema, err)
		case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%s: want a refusal naming %q, got %v", tc.schema, tc.why, err)
		}
	}
}

const schema = `{"type":"object","properties":{
"region":{"type":"string","x-mcp-header":"Region"},
"priority":{"type":"integer","x-mcp-header":"Priority"},
"verbose":{"type":"boolean","x-mcp-header":"Verbose"},
"query":{"type":"string"}}}`

// TestMirror: plain ASCII as it is, the rest base64 in the sentinel, null
// and absent left out, unannotated never.
func TestMirror(t *testing.T) {
	for args, want := range map[string]map[string]string{
		`{"region":"us-west1","priority":42,"verbose":false,"query":"SELECT 1"}`: {"Mcp-Param-Region": "us-west1", "Mcp-Param-Priority": "42", "Mcp-Param-Verbose": "false"},
		`{"region":"Hello, 世界","priority":-3,"verbose":null}`:                    {"Mcp-Param-Region": "=?base64?SGVsbG8sIOS4lueVjA==?=", "Mcp-Param-Priority": "-3"},
		`{"region":" padded "}`:        {"Mcp-Param-Region": "=?base64?IHBhZGRlZCA=?="},
		`{"region":"line1\nline2"}`:    {"Mcp-Param-Region": "=?base64?bGluZTEKbGluZTI=?="},
		`{"region":"=?base64?abc?="}`:  {"Mcp-Param-Region": "=?base64?PT9iYXNlNjQ/YWJjPz0=?="},
		`{"region":"","priority":1.5}`: {"Mcp-Param-Region": ""},
		`{"query":"x"}`:                nil,
	} {
		if got := Mirror(json.RawMessage(schema), json.RawMessage(args)); !maps.Equal(got, want) {
			t.Errorf("%s: mirrored %q, want %q", args, got, want)
		}
	}
}

// TestCheck: what a server refuses, with -32020's error; required false
// (a client before 2026-07-28) lets an absent header pass, not a wrong one.
func TestCheck(t *testing.T) {
	args := json.RawMessage(`{"region":"us","priority":7,"verbose":true}`)
	ok := http.Header{"Mcp-Param-Region": {"us"}, "Mcp-Param-Priority": {"7"}, "Mcp-Param-Verbose": {"true"}}
	for _, tc := range []struct {
		name     string
		change   func(http.Header)
		required bool
		refused  bool
	}{
		{"all agree", func(http.Header) {}, true, false},
		{"base64 form", func(h http.Header) { h.Set("Mcp-Param-Region", "=?base64?dXM=?=") }, true, false},
		{"integer as 7.0", func(h http.Header) { h.Set("Mcp-Param-Priority", "7.0") }, true, false},
		{"mismatch", func(h http.Header) { h.Set("Mcp-Param-Region", "eu") }, true, true},
		{"missing", func(h http.Header) { h.Del("Mcp-Param-Region") }, true, true},
		{"bad padding", func(h http.Header) { h.Set("Mcp-Param-Region", "=?base64?dXM?=") }, true, true},
		{"bad characters", func(h http.Header) { h.Set("Mcp-Param-Region", "=?base64?d!!M=?=") }, true, true},
		{"value case", func(h http.Header) { h.Set("Mcp-Param-Verbose", "TRUE") }, true, true},
		{"missing, not required", func(h http.Header) { h.Del("Mcp-Param-Region") }, false, false},
		{"mismatch, not required", func(h http.Header) { h.Set("Mcp-Param-Region", "eu") }, false, true},
		{"none, not required", func(h http.Header) { clear(h) }, false, false},
	} {
		h := ok.Clone()
		tc.change(h)
		err := Check(h, json.RawMessage(schema), args, tc.required)
		var mismatch mcp.HeaderMismatchError
		if tc.refused != (err != nil) || (err != nil && !errors.As(err, &mismatch)) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "Mcp-Param-") {
			t.Errorf("%s: the error does not name the header: %v", tc.name, err)
		}
	}
	// No arguments at all: nothing to compare (mcp-go's rule).
	if err := Check(http.Header{"Mcp-Param-Region": {"us"}}, json.RawMessage(schema), nil, true); err != nil {
		t.Errorf("without arguments: %v", err)
	}
	// A header for an argument the body does not have.
	if err := Check(http.Header{"Mcp-Param-Region": {"us"}}, json.RawMessage(schema), json.RawMessage(`{}`), false); err == nil {
		t.Errorf("a header for an absent argument passed")
	}
}

// BenchmarkCheck is what the fast call adds to a call of a tool with
// x-mcp-header parameters; BenchmarkNotAnnotated to any other call.
func BenchmarkCheck(b *testing.B) {
	args := json.RawMessage(`{"region":"us","priority":7,"verbose":true,"query":"SELECT 1"}`)
	h := http.Header{"Mcp-Param-Region": {"us"}, "Mcp-Param-Priority": {"7"}, "Mcp-Param-Verbose": {"true"}}
	for b.Loop() {
		if err := Check(h, json.RawMessage(schema), args, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNotAnnotated(b *testing.B) {
	plain := json.RawMessage(`{"type":"object","properties":{"region":{"type":"string"},"priority":{"type":"integer"},"query":{"type":"string"}}}`)
	args := json.RawMessage(`{"region":"us","priority":7,"query":"SELECT 1"}`)
	for b.Loop() {
		if err := Check(nil, plain, args, true); err != nil {
			b.Fatal(err)
		}
	}
}
