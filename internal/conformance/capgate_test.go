package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestConformanceThroughCapgate (expected results in capgate_baseline.json,
// today every scenario passing) runs the suite against the fixture
// directly and through capgate in transparent mode (one upstream, prefix
// ""), with anonymous callers as the suite sends no token. Scenarios that
// differ must be listed, with their reason, in capgate_baseline.json.
func TestConformanceThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the MCP conformance suite")
	}
	Install(t)
	fx := StartFixture(t)
	ctx := context.Background()
	direct, err := Run(ctx, t, fx)
	if err != nil {
		t.Fatal(err)
	}

	cg := testkit.StartCapgate(t, testkit.Capgate{Secret: "conformance-secret", Config: fmt.Sprintf(`
[auth.anonymous]
sub = "conformance"
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.fx]
url = %q
prefix = ""
`, fx)})
	proxied, err := Run(ctx, t, cg.URL+"/mcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("direct:  %s", Summary(direct))
	t.Logf("capgate: %s", Summary(proxied))
	base, err := LoadBaseline("capgate_baseline.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range base.Check(proxied) {
		t.Error(p)
	}
	// Every difference from the direct run is a listed, explained failure.
	for _, d := range Compare(direct, proxied) {
		name, _, _ := strings.Cut(d, ":")
		if e, ok := base.Scenarios[name]; !ok || e.Expect == "pass" {
			t.Errorf("through capgate differs from direct, unexplained: %s", d)
		}
	}
}
