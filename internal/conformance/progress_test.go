package conformance

import (
	"net/http"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// testStatelessProgress (issue 31): the reference server
// answers a 2026-07-28 call of test_tool_with_progress with its three
// progress notifications and its result in one burst; through capgate
// every one of them reaches the caller, before the result, call after
// call. (mcp-go v1.2.1 dropped a notification its forwarder held when the
// handler returned first: the first, in most runs.)
func testStatelessProgress(t *testing.T, cg *testkit.Served) {
	const body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_tool_with_progress","arguments":{},` +
		`"_meta":{"progressToken":"pt","io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	want := []string{`"progress":0`, `"progress":50`, `"progress":100`, `"result"`}
	for i := range 20 {
		st, _, b := testkit.PostMCP(t, cg.URL, "", "test_tool_with_progress", body)
		var got []string
		for _, line := range strings.Split(string(b), "\n") {
			for _, w := range want {
				if strings.HasPrefix(line, "data: ") && strings.Contains(line, w) {
					got = append(got, w)
				}
			}
		}
		if st != http.StatusOK || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("call %d: got %v, want %v:\n%s", i+1, got, want, b)
		}
	}
}
