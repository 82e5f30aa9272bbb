package conformance

import (
	"fmt"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// throughCapgate starts capgate in front of upstream in transparent mode
// (its one upstream, prefix ""), every caller anonymous as sub with every
// grant and tier, as the suite calls it.
func throughCapgate(t *testing.T, sub, upstream string) *testkit.Served {
	t.Helper()
	return testkit.StartCapgate(t, testkit.Capgate{Secret: "conformance-secret", Config: fmt.Sprintf(`
[auth.anonymous]
sub = %q
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.up]
url = %q
prefix = ""
`, sub, upstream)})
}
