//go:build linux

package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// TestMCPServerDenialIsNamedAsRoot: a stdio MCP server declaring
// filesystem read answers a tool error when it cannot read a file outside
// its read paths; a root serve reading Landlock's audit records adds to
// that call's result (the only one in flight) the access the kernel
// refused and the declaration that would allow it, and logs the denial
// once however often it recurs. A server refused its own script names it
// in the error its calls get.
func TestMCPServerDenialIsNamedAsRoot(t *testing.T) {
	needKernelAudit(t, "TestMCPServerDenialUnprivileged")
	s, call, connect, down, secret, script := mcpDenial(t, nil)
	checkConnectNamed(t, s, connect)
	want := fmt.Sprintf("capgate: the kernel refused it reading %s (fs.read_file); to allow it: add %q to read_paths in capabilities of [mcp.servers.files]",
		secret, filepath.Dir(secret))
	if !strings.Contains(call, want) {
		t.Errorf("the failed call's result lacks %q:\n%s", want, call)
	}
	logged := `msg="the sandbox refused an MCP server" server=files denied="the kernel refused it reading ` + secret
	if n := strings.Count(s.logs(), logged); n != 1 {
		t.Errorf("the denial, made twice, is logged %d times, want once:\n%s", n, s.logs())
	}
	if want := "the kernel refused it reading " + script + " (fs.read_file)"; !strings.Contains(down, want) {
		t.Errorf("the down server's error lacks %q:\n%s", want, down)
	}
}

// TestMCPServerDenialUnprivileged: an unprivileged serve reads no audit;
// the call's error result names the file it reports refused, checked
// against the server's sandbox rules and labelled as the server's report,
// and the down server's error the script its stderr reports refused.
func TestMCPServerDenialUnprivileged(t *testing.T) {
	user := unprivileged()
	s, call, connect, down, secret, script := mcpDenial(t, user)
	checkConnectNamed(t, s, connect)
	want := fmt.Sprintf("capgate: its error result reports a refused access to %s, which its sandbox does not let it read", secret)
	hint := fmt.Sprintf("to allow it: add %q to read_paths in capabilities of [mcp.servers.files]", filepath.Dir(secret))
	if !strings.Contains(call, want) || !strings.Contains(call, hint) || strings.Contains(call, "the kernel refused") {
		t.Errorf("the failed call's result lacks %q and %q (or claims the kernel's word):\n%s", want, hint, call)
	}
	if want := "its stderr reports a refused access to " + script + ", which its sandbox does not let it read"; !strings.Contains(down, want) {
		t.Errorf("the down server's error lacks %q:\n%s", want, down)
	}
}

// mcpDenial serves a stdio MCP server that fails a call reading a file
// it may not (twice) and one connecting under network none, and one that
// may not read its own script; it returns the first call's output, the
// connect's, the second server's error, the file and the script.
func mcpDenial(t *testing.T, user *testkit.User) (s *served, call, connect, down, secret, script string) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 || (user != nil && !f.UserNS) {
		t.Skipf("this kernel cannot enforce filesystem guarantees here: %+v", f)
	}
	other := publicDir(t, nil)
	secret, script = filepath.Join(other, "notes"), filepath.Join(other, "server.sh")
	writeFile(t, secret, "never")
	writeFile(t, script, "echo never\n")
	cg := testkit.StartCapgate(t, testkit.Capgate{User: user, Dir: publicDir(t, user), Config: fmt.Sprintf(`
[sandbox]
audit_file_denials = true

[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[mcp.servers.files]
command = %q
risk = "LOW"
side_effects = []
capabilities = { filesystem = "read", network = "none" }

[mcp.servers.files.env]
MCPFIXTURE_ATTEMPTS = "1"

[mcp.servers.broken]
command = "/bin/sh"
args = ["-c", ". %s || exit 3"]
capabilities = { filesystem = "read" }
`, testkit.Build(t, testkit.MCPFixture), script)})
	s = fromCapgate(cg)
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	for i := range 2 {
		out, errb, _ := s.as(t, tok, "invoke", "--capability", "mcp:files:attempt_or_fail", "--input-json", fmt.Sprintf(`{"try":%q}`, "read="+secret))
		if i == 0 {
			call = strings.ReplaceAll(out+errb, `\"`, `"`) // the result's text, unquoted
		}
	}
	t.Logf("the call: %s", call)
	out, errb, _ := s.as(t, tok, "invoke", "--capability", "mcp:files:attempt_or_fail", "--input-json", `{"try":"tcp=127.0.0.1:9"}`)
	connect = strings.ReplaceAll(out+errb, `\"`, `"`)
	t.Logf("the connect: %s", connect)
	if strings.Contains(call, `"never"`) {
		t.Fatalf("the server read %s", secret)
	}
	outb, errb, _ := s.as(t, tok, "invoke", "--capability", "mcp:broken:echo")
	down = outb + errb
	t.Logf("the down server: %s", down)
	return s, call, connect, down, secret, script
}

// checkConnectNamed: a socket the kernel refused the server under network
// none (seccomp hands it to capgate as it happens, root or not) is named
// in that call's result with the declaration that allows it, logged, and
// recorded as the call's capability_check.
func checkConnectNamed(t *testing.T, s *served, connect string) {
	t.Helper()
	want := "capgate: the kernel refused it a socket (no_network, set by tool); to allow it: declare network: outbound in capabilities of [mcp.servers.files]"
	if !strings.Contains(connect, want) {
		t.Errorf("the connect's result lacks %q:\n%s", want, connect)
	}
	// serve gathers log lines for up to 100 ms: wait for the line.
	if !testkit.Poll(10*time.Second, func() bool {
		return strings.Contains(s.logs(), `msg="the sandbox refused an MCP server" server=files denied="the kernel refused it a socket (no_network, set by tool)"`)
	}) {
		t.Errorf("the refused socket is not logged:\n%s", s.logs())
	}
	// The log commits in groups: wait for the call's record.
	if !testkit.Poll(10*time.Second, func() bool {
		for _, c := range auditRecords(t, s, record("capability_check", "mcp:files:attempt_or_fail")) {
			if c["capability"] == "network" && c["reason"] == "guarantee_blocked" && c["allowed"] == false {
				return true
			}
		}
		return false
	}) {
		t.Errorf("the refused socket is no capability_check record of the call")
	}
}
