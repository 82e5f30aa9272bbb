package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// Custom headers from tool parameters (SEP-2243) through a real capgate
// serve, in front of a real upstream whose tools carry x-mcp-header
// annotations (internal/testkit/headersfixture, on mcp-go), with raw
// requests over streamable HTTP.

// startHeadersFixture serves the headers fixture with args and returns its
// address.
func startHeadersFixture(t *testing.T, args ...string) string {
	t.Helper()
	addr := testkit.FreeAddr(t)
	testkit.ServeFixture(t, testkit.HeadersFixture, 15*time.Second, addr, append(args, "-http", addr)...)
	return addr
}

// headersConfig is capgate's config over the fixture at addr, prefix hf:
// alice may call all its tools.
func headersConfig(addr string) string {
	return fmt.Sprintf(`
[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.hf.*"]

[mcp.servers.hf]
url = "http://%s/mcp"
risk = "LOW"
`, addr)
}

// invalidHeaderTools are the fixture's tools (the conformance suite's)
// whose x-mcp-header annotations must be refused, with what the refusal
// names.
var invalidHeaderTools = map[string]string{
	"invalid_empty_header":        "must be a non-empty string",
	"invalid_object_header":       `got \"object\"`,
	"invalid_array_header":        `got \"array\"`,
	"invalid_null_header":         `got \"null\"`,
	"invalid_number_header":       `got \"number\"`,
	"invalid_duplicate_same_case": `duplicate x-mcp-header value \"Region\"`,
	"invalid_duplicate_diff_case": "duplicate x-mcp-header value",
	"invalid_space_in_name":       `contains invalid character ' '`,
	"invalid_colon_in_name":       `contains invalid character ':'`,
	"invalid_non_ascii_name":      `contains invalid character 'é'`,
	"invalid_control_char_name":   `contains invalid character '\\t'`,
}

// listedNames is what tools/list (2026-07-28) shows tok.
func listedNames(t *testing.T, base, tok string) []string {
	t.Helper()
	a := post2026(t, base, tok, "tools/list", "", metaPlain)
	var tools []struct{ Name string }
	if err := json.Unmarshal(a.Result["tools"], &tools); err != nil || a.Status != 200 {
		t.Fatalf("tools/list: %d %v %s", a.Status, err, a.Raw)
	}
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	return names
}

// TestInvalidHeaderToolsRefused: an upstream lists, besides valid tools,
// the suite's eleven tools whose x-mcp-header annotations break SEP-2243.
// capgate keeps serving (before, mcp-go's SetTools panicked on the first
// one and serve died at start), lists the valid tools and none of the
// invalid ones, logs each refusal naming the tool and what is wrong, and a
// call of a refused tool is not found and never reaches the upstream.
func TestInvalidHeaderToolsRefused(t *testing.T) {
	t.Parallel()
	fx := startHeadersFixture(t, "-invalid")
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: headersConfig(fx)})
	alice := cg.Token(t, token.Claims{Sub: "alice"})

	names := listedNames(t, cg.URL, alice)
	for _, want := range []string{"hf__valid_tool", "hf__test_custom_headers", "hf__test_custom_headers_null"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks the valid tool %s: %v", want, names)
		}
	}
	for name := range invalidHeaderTools {
		if slices.Contains(names, "hf__"+name) {
			t.Errorf("tools/list shows %s, whose x-mcp-header is invalid", name)
		}
		a := post2026(t, cg.URL, alice, "tools/call", "hf__"+name,
			fmt.Sprintf(`"name":"hf__%s","arguments":{"value":"x"},%s`, name, metaPlain))
		if strings.Contains(a.Raw, "invalid tool called") || a.Error == nil {
			t.Errorf("a call of the refused %s: %d %s", name, a.Status, a.Raw)
		}
	}
	// serve's log lines are gathered before they are written: wait for them.
	var missing []string
	testkit.Poll(10*time.Second, func() bool {
		missing = refusalsMissing(cg.Logs())
		return len(missing) == 0
	})
	for _, m := range missing {
		t.Error(m)
	}
}

// refusalsMissing lists the invalid tools whose refusal logs lacks, or
// logs without naming what is wrong.
func refusalsMissing(logs string) []string {
	var out []string
	for name, why := range invalidHeaderTools {
		line := ""
		for l := range strings.Lines(logs) {
			if strings.Contains(l, "tool=mcp:hf:"+name+" ") {
				line = l
			}
		}
		if !strings.Contains(line, "tool refused: its x-mcp-header annotations are invalid") || !strings.Contains(line, why) {
			out = append(out, fmt.Sprintf("no refusal of %s naming %q in serve's log: %q", name, why, line))
		}
	}
	return out
}

// post2026Headers calls tool with args as tok on 2026-07-28 with the
// standard headers and more, and reads the JSON answer.
func post2026Headers(t *testing.T, base, tok, tool, args string, more map[string]string) rpcAnswer2026 {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":%s,%s}}`, tool, args, metaPlain)
	status, ctype, b := testkit.PostMCPWith(t, base, tok, "tools/call", tool, body, more)
	return read2026(t, "tools/call", status, ctype, b)
}

// b64 is a value in the specification's base64 form.
func b64(s string) string { return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(s)) + "?=" }

// TestParamHeadersMirrored: a 2026-07-28 call of a tool with x-mcp-header
// parameters reaches the upstream with each annotated argument in its
// Mcp-Param-* header, encoded as the specification says (printable ASCII
// as it is; non-ASCII, control characters, surrounding spaces and values
// that look encoded in base64), byte for byte; unannotated, null and
// absent arguments have none. The upstream (mcp-go) checks them and, before
// capgate mirrored them, refused every such call with -32020.
func TestParamHeadersMirrored(t *testing.T) {
	t.Parallel()
	fx := startHeadersFixture(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: headersConfig(fx)})
	alice := cg.Token(t, token.Claims{Sub: "alice"})

	args := map[string]any{
		"region": "us-west1", "priority": 42, "verbose": false, "debug": true, "empty_val": "",
		"method_val": "test-method", "float_val": 3.14159, "non_ascii_val": "Hello, 世界",
		"whitespace_val": " padded ", "leading_space_val": " us-west1", "trailing_space_val": "us-west1 ",
		"internal_space_val": "us west 1", "control_char_val": "line1\nline2", "crlf_val": "line1\r\nline2",
		"tab_val": "\tindented", "sentinel_val": "=?base64?abc?=", "query": "SELECT * FROM users",
	}
	want := map[string][]string{
		"mcp-method": {"tools/call"}, "mcp-name": {"test_custom_headers"},
		"mcp-param-region": {"us-west1"}, "mcp-param-priority": {"42"}, "mcp-param-verbose": {"false"},
		"mcp-param-debug": {"true"}, "mcp-param-emptyval": {""}, "mcp-param-method": {"test-method"},
		"mcp-param-nonascii": {"=?base64?SGVsbG8sIOS4lueVjA==?="}, "mcp-param-whitespace": {"=?base64?IHBhZGRlZCA=?="},
		"mcp-param-leadingspace": {b64(" us-west1")}, "mcp-param-trailingspace": {b64("us-west1 ")},
		"mcp-param-internalspace": {"us west 1"}, "mcp-param-controlchar": {b64("line1\nline2")},
		"mcp-param-crlf": {b64("line1\r\nline2")}, "mcp-param-tab": {b64("\tindented")},
		"mcp-param-sentinel": {b64("=?base64?abc?=")},
	}
	// The caller sends the same headers (capgate checks them, below).
	sent := map[string]string{}
	for k, v := range want {
		if strings.HasPrefix(k, "mcp-param-") {
			sent[k] = v[0]
		}
	}
	b, _ := json.Marshal(args)
	a := post2026Headers(t, cg.URL, alice, "hf__test_custom_headers", string(b), sent)
	if got := receivedHeaders(t, a); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("the upstream received\n%q\nwant\n%q", got, want)
	}

	// An absent argument: no header. (A null one capgate's input check
	// refuses here, the schema saying boolean; Mirror leaves it out.)
	a = post2026Headers(t, cg.URL, alice, "hf__test_custom_headers_null",
		`{"region":"us-east1","priority":1,"query":"SELECT 1"}`,
		map[string]string{"Mcp-Param-Region": "us-east1", "Mcp-Param-Priority": "1"})
	if got, want := receivedHeaders(t, a), map[string][]string{"mcp-method": {"tools/call"}, "mcp-name": {"test_custom_headers_null"},
		"mcp-param-region": {"us-east1"}, "mcp-param-priority": {"1"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("without verbose, the upstream received %q, want %q", got, want)
	}
}

// receivedHeaders reads the fixture's answer: the headers it was called
// with.
func receivedHeaders(t *testing.T, a rpcAnswer2026) map[string][]string {
	t.Helper()
	var res struct {
		Content []struct{ Text string }
		IsError bool
	}
	if a.Status != 200 || a.Error != nil || json.Unmarshal(mustJSON(a.Result), &res) != nil || len(res.Content) == 0 || res.IsError {
		t.Fatalf("the call: %d %s", a.Status, a.Raw)
	}
	var got map[string][]string
	if err := json.Unmarshal([]byte(res.Content[0].Text), &got); err != nil {
		t.Fatalf("the fixture's answer %q: %v", res.Content[0].Text, err)
	}
	return got
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestParamHeadersChecked: capgate checks a 2026-07-28 caller's
// Mcp-Param-* headers against the body before the call goes anywhere, as
// the conformance suite's http-custom-header-server-validation does: a
// header that is missing, differs, or is badly encoded is refused with
// HTTP 400 and -32020 naming the header; base64 and surrounding spaces
// are accepted, and a value without the whole =?base64?...?= wrapper is
// taken as it is. (capgate's mirrored headers are right, TestParamHeaders
// Mirrored, so a -32020 here is capgate's own.)
func TestParamHeadersChecked(t *testing.T) {
	t.Parallel()
	fx := startHeadersFixture(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: headersConfig(fx)})
	alice := cg.Token(t, token.Claims{Sub: "alice"})
	for _, tc := range []struct {
		name, region string
		header       map[string]string
		ok           bool
	}{
		{"as it is", "us-west1", map[string]string{"Mcp-Param-Region": "us-west1"}, true},
		{"base64", "Hello", map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8=?="}, true},
		{"surrounding spaces", "us-west1", map[string]string{"Mcp-Param-Region": "   us-west1  "}, true},
		{"no prefix: literal", "SGVsbG8=", map[string]string{"Mcp-Param-Region": "SGVsbG8="}, true},
		{"no suffix: literal", "=?base64?SGVsbG8=", map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8="}, true},
		{"differs", "us-west1", map[string]string{"Mcp-Param-Region": "eu-west1"}, false},
		{"missing", "us-west1", nil, false},
		{"bad padding", "Hello", map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8?="}, false},
		{"bad characters", "Hello", map[string]string{"Mcp-Param-Region": "=?base64?SGVs!!!bG8=?="}, false},
		{"for an absent argument", "", map[string]string{"Mcp-Param-Region": "us"}, false},
	} {
		args := fmt.Sprintf(`{"region":%q}`, tc.region)
		if tc.region == "" {
			args = `{}`
		}
		a := post2026Headers(t, cg.URL, alice, "hf__valid_tool", args, tc.header)
		switch {
		case tc.ok && (a.Status != 200 || a.Error != nil || strings.Contains(a.Raw, `"isError":true`)):
			t.Errorf("%s: refused: %d %s", tc.name, a.Status, a.Raw)
		case !tc.ok && (a.Status != 400 || a.Error == nil || a.Error.Code != -32020 || !strings.Contains(a.Error.Message, "Mcp-Param-Region")):
			t.Errorf("%s: want 400 -32020 naming Mcp-Param-Region, got %d %s", tc.name, a.Status, a.Raw)
		}
	}
}
