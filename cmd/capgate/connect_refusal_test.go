package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestConnectSaysWhyTheTokenIsRefused: `capgate connect` against a real
// serve, with a token the remote refuses, exits 1 naming the remote's
// reason (its WWW-Authenticate error_description: expired, bad signature),
// not only "authorization required"; the token is never printed.
func TestConnectSaysWhyTheTokenIsRefused(t *testing.T) {
	t.Parallel()
	cg := testkit.StartCapgate(t, testkit.Capgate{})
	expired := cg.Token(t, token.Claims{Sub: "late", IssuedAt: time.Now().Add(-2 * time.Hour), ExpiresAt: time.Now().Add(-time.Hour)})
	forged := testkit.Mint(t, "another-key-entirely-0123456789abcdef", token.Claims{Sub: "mallory"})
	for _, tc := range []struct{ name, tok, why string }{
		{"expired", expired, "invalid_token: expired: token expired"},
		{"another key", forged, "invalid_token: signature: HS256 signature does not verify"},
		{"not a JWT", "not-a-jwt-at-all", "invalid_token: format: a token has three dot-separated parts"},
	} {
		cmd := exec.Command(cg.Bin, "connect", cg.URL+"/mcp")
		cmd.Env = []string{"CAPGATE_TOKEN=" + tc.tok, "PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 {
			t.Errorf("%s: %v, want exit 1\n%s", tc.name, err, out)
			continue
		}
		msg := string(out)
		if !strings.Contains(msg, "the remote refused the token: "+tc.why) || !strings.Contains(msg, "(HTTP 401)") {
			t.Errorf("%s: connect does not say why:\n%s\nwant the reason %q", tc.name, msg, tc.why)
		}
		if strings.Contains(msg, tc.tok) {
			t.Errorf("%s: connect printed the token:\n%s", tc.name, msg)
		}
	}
}
