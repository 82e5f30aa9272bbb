package testkit

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/capgate/capgate/token"
)

func TestMain(m *testing.M) { Main(m) }

// TestStartCapgate: serve runs on the written config, takes the tokens
// Token mints (and no other key's), serves the socket asked for, and Stop
// ends it.
func TestStartCapgate(t *testing.T) {
	cg := StartCapgate(t, Capgate{Socket: true, Config: fmt.Sprintf(`
[policy]
grants = ["rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q

[mcp.servers.fx.tools.t_00]
risk = "LOW"
`, Build(t, MCPFixture))})
	if !strings.Contains(cg.Banner, cg.URL+"/mcp") || !strings.Contains(cg.Banner, "unix://"+cg.Socket) {
		t.Errorf("banner:\n%s", cg.Banner)
	}
	if _, err := os.Stat(cg.Socket); err != nil {
		t.Errorf("socket: %v", err)
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__t_00","arguments":{},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	if code, _, body := PostMCP(t, cg.URL, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "fx__t_00", call); code != 200 {
		t.Errorf("with Token's token: %d %s", code, body)
	}
	if code, _, body := PostMCP(t, cg.URL, Mint(t, "another-secret-entirely-0000", token.Claims{Sub: "alice"}), "fx__t_00", call); code != 401 {
		t.Errorf("with another key's token: %d %s, want 401", code, body)
	}

	if err := cg.Stop(t); err != nil {
		t.Errorf("serve after SIGTERM: %v\n%s", err, cg.Logs())
	}
	if c, err := net.Dial("tcp", cg.Addr); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Stop", cg.Addr)
	}
}

// TestStartCapgateTakenPort: a port StartCapgate picked that is taken by
// the time serve binds it (another process's connection took it) is
// picked again, and serve runs on the new one, which AddrHere in the
// config names too.
func TestStartCapgateTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	picks := 0
	pickAddr = func(tb testing.TB) string {
		if picks++; picks == 1 {
			return taken.Addr().String()
		}
		return FreeAddr(tb)
	}
	t.Cleanup(func() { pickAddr = FreeAddr })
	cg := StartCapgate(t, Capgate{Server: "advertise_url = \"http://" + AddrHere + "\""})
	if picks != 2 || cg.Addr == taken.Addr().String() || !strings.Contains(cg.Banner, cg.URL+"/mcp") {
		t.Fatalf("%d picks; serve on %s (taken: %s); banner:\n%s", picks, cg.Addr, taken.Addr(), cg.Banner)
	}
	if b, err := os.ReadFile(cg.ConfigPath); err != nil || !strings.Contains(string(b), fmt.Sprintf("listen = %q", cg.Addr)) ||
		!strings.Contains(string(b), fmt.Sprintf("advertise_url = \"http://%s\"", cg.Addr)) {
		t.Errorf("the config does not name the new address %s (listen and AddrHere): %v\n%s", cg.Addr, err, b)
	}
}
