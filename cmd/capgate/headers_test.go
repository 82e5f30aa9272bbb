package main

import (
	"encoding/json"
	"fmt"
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
