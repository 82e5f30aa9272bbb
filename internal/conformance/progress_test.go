package conformance

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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

// TestProgressSplitThroughCapgate: a caller of 2025-11-25 calls the
// fixture's progress_burst through capgate, which speaks 2025-11-25 to the
// fixture on a session with its standalone stream open. mcp-go v1.2.1 splits
// the call's 20 back-to-back progress notifications between that stream and
// the call's (sources/mcp/progress.go), and capgate relays both: before the
// merge most calls showed the caller its progress going back. Now every
// call's progress goes forward, all of it before the result.
func TestProgressSplitThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the fixture and capgate")
	}
	t.Parallel()
	cg := throughCapgate(t, "progress", StartFixture(t))
	sid := testkit.OpenSession(t, cg.URL, "", "{}")
	relayed := 0
	for i := range 10 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"progress_burst",`+
			`"arguments":{"count":20},"_meta":{"progressToken":"pt"}}}`, i+1)
		st, ct, b := testkit.PostSession(t, cg.URL, "", sid, body)
		if st != http.StatusOK || ct != "text/event-stream" {
			t.Fatalf("call %d: %d %s: %s", i+1, st, ct, b)
		}
		var got []float64
		result := false
		for _, line := range strings.Split(string(b), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var m struct {
				Method string
				Params struct {
					ProgressToken string
					Progress      float64
				}
				Result json.RawMessage
			}
			if err := json.Unmarshal([]byte(data), &m); err != nil {
				t.Fatalf("call %d: %v: %s", i+1, err, data)
			}
			switch {
			case result:
				t.Errorf("call %d: %s after the result", i+1, data)
			case m.Method == "notifications/progress" && m.Params.ProgressToken == "pt":
				got = append(got, m.Params.Progress)
			case m.Result != nil:
				result = true
			}
		}
		if !result || len(got) == 0 || got[0] < 1 || got[len(got)-1] > 20 || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("call %d: progress %v, result %v; want progress going forward from 1 to at most 20, then the result:\n%s", i+1, got, result, b)
		}
		relayed += len(got)
	}
	t.Logf("%d of 200 notifications relayed", relayed)
}
