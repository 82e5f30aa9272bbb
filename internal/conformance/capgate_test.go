package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	cfg := filepath.Join(dir, "capgate.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`
[server]
listen = %q
data_dir = "data"
socket = "-"

[auth.anonymous]
sub = "conformance"
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.fx]
url = %q
prefix = ""
`, addr, fx)), 0o600)
	testkit.Serve(t, testkit.Build(t, "github.com/capgate/capgate/cmd/capgate"), cfg, "CAPGATE_TOKEN_SECRET=conformance-secret")
	proxied, err := Run(ctx, t, "http://"+addr+"/mcp")
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
