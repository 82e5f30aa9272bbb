//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// helloServer listens on loopback TCP, says "hello" to each connection
// and returns its address; cleanup closes it.
func helloServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// invoker runs `capgate capability invoke --capability ARGS...` as tok and
// returns its output; a call that does not answer fails the test.
func invoker(t *testing.T, s *served, tok string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, errb, code := s.as(t, tok, append([]string{"invoke", "--capability"}, args...)...)
		if code != 0 {
			t.Fatalf("invoke %v: the call did not answer: %d %s %s\n%s", args, code, out, errb, s.logs())
		}
		return out
	}
}

// TestDeclaredGuaranteesConfineEverySource runs a real capgate serve whose
// three kinds of subprocess declare what they cannot do, and has each try
// it anyway: the kernel stops each attempt, the call still answers, and
// the same program undeclared does what the declared one could not.
func TestDeclaredGuaranteesConfineEverySource(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	f := sandbox.Probe()
	if f.LandlockABI < 1 || !f.Seccomp || (!f.NetNS && f.LandlockABI < 4) {
		t.Skipf("this kernel cannot enforce the guarantees: %+v", f)
	}
	tcp := "tcp=" + helloServer(t)

	pack := filepath.Join(t.TempDir(), "probe")
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	cmd := func(name, caps string) string {
		return fmt.Sprintf("  %s:\n    description: Try to connect\n    run: [%q, \"--json\", %q, \"spawn=/bin/true\"]\n    risk: LOW\n    side_effects: []\n%s",
			name, hostile, tcp, caps)
	}
	manifest := "id: probe\nname: Probe\ndescription: Hostile commands\ncommands:\n" +
		cmd("sealed", "    capabilities:\n      network: none\n") + cmd("open", "") + cmd("tightened", "")
	writeFile(t, filepath.Join(pack, "extension.yaml"), manifest)
	fixture := testkit.Build(t, testkit.MCPFixture)
	server := func(name, caps string) string {
		return fmt.Sprintf("[mcp.servers.%s]\ncommand = %q\nrisk = \"LOW\"\nside_effects = []\n%s\n[mcp.servers.%s.env]\nMCPFIXTURE_ATTEMPTS = \"1\"\n\n",
			name, fixture, caps, name)
	}
	// No token secret: capgate makes its development key in the data dir,
	// the file a tool must never read.
	cg := testkit.StartCapgate(t, testkit.Capgate{NoSecret: true, Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

# The operator tightens one undeclared command, and cannot loosen one
# that declared network none.
[capability_overrides."ext:probe:tightened"]
no_network = true

[capability_overrides."ext:probe:sealed"]
no_network = false

[capabilities.providers.gog]
command = [%q]
capabilities = { subprocess = "none" }

%s%s`, filepath.Dir(pack), testkit.Build(t, testkit.BridgeFixture),
		server("sealed", `capabilities = { filesystem = "none" }`), server("open", ""))})
	s := fromCapgate(cg)
	keyFile := filepath.Join(cg.Dir, "data", "token.secret")
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	alice := testkit.Mint(t, string(key), token.Claims{Sub: "alice", ChatType: "private"})
	invoke := invoker(t, s, alice)

	// An extension command declaring network none cannot connect; the
	// same command undeclared can.
	if out := invoke("ext:probe:sealed"); !strings.Contains(out, `"`+tcp+`": "denied`) {
		t.Errorf("network none connected:\n%s", out)
	}
	if out := invoke("ext:probe:open"); !strings.Contains(out, `"`+tcp+`": "ok hello"`) || !strings.Contains(out, `"spawn=/bin/true": "ok `) {
		t.Errorf("the undeclared command could not connect and spawn:\n%s", out)
	}

	if out := invoke("ext:probe:tightened"); !strings.Contains(out, `"`+tcp+`": "denied`) {
		t.Errorf("the operator's no_network did not hold:\n%s", out)
	}
	if logs := s.logs(); !strings.Contains(logs, "no_network = false would loosen a guarantee set by tool; ignored") {
		t.Errorf("the loosening override was not reported:\n%s", logs)
	}

	// A stdio MCP server declaring filesystem none cannot read a file
	// beside its pack, nor capgate's token key; the same server
	// undeclared reads the file, and the baseline keeps the key from it.
	notes := filepath.Join(filepath.Dir(pack), "notes.txt")
	writeFile(t, notes, "beside-the-pack")
	if err := os.Chmod(notes, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{notes, keyFile} {
		read := `{"try":"read=` + p + `"}`
		if out := invoke("mcp:sealed:attempt", "--input-json", read); !strings.Contains(out, "denied") || strings.Contains(out, strings.TrimSpace(string(key))) {
			t.Errorf("filesystem none read %s:\n%s", p, out)
		}
	}
	if out := invoke("mcp:open:attempt", "--input-json", `{"try":"read=`+notes+`"}`); !strings.Contains(out, "ok beside-the-pack") {
		t.Errorf("the undeclared server could not read a file beside the pack (the test proves nothing):\n%s", out)
	}
	if out := invoke("mcp:open:attempt", "--input-json", `{"try":"read=`+keyFile+`"}`); !strings.Contains(out, "denied") || strings.Contains(out, strings.TrimSpace(string(key))) {
		t.Errorf("the undeclared server read capgate's key:\n%s", out)
	}

	// A bridge provider declaring subprocess none cannot spawn /bin/true
	// (the undeclared extension command above could), and still answers.
	out := invoke("gog.calendar", "--operation", "list_events", "--input-json", `{"attempt":"spawn=/bin/true"}`)
	if !strings.Contains(out, "denied") || !strings.Contains(out, "operation not permitted") {
		t.Errorf("subprocess none spawned:\n%s", out)
	}
}
