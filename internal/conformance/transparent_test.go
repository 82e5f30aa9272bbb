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

// TestCallsThroughCapgate runs the tests that make calls of their own
// through capgate to the reference server on one reference server and one
// capgate: each start costs about a second of CPU, and no call of one test
// changes what another's sees.
func TestCallsThroughCapgate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the reference server")
	}
	t.Parallel()
	InstallRef(t)
	cg := throughCapgate(t, "reference", StartReference(t))
	t.Run("errors", func(t *testing.T) { testErrors(t, cg) })
	t.Run("polling", func(t *testing.T) { testPolling(t, cg) })
	t.Run("stateless progress", func(t *testing.T) { testStatelessProgress(t, cg) })
}
