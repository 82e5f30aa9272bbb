package app

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestReloadUnderLoad: calls keep succeeding through the front door, over
// a real listener, while reloads swap generations under them: each
// finishes on the sources it began on, which close only after (run with
// -race: the swap point is the only shared state). A reload that changes
// the listen address says it needs a restart.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	src := fmt.Sprintf(`
[server]
listen = %%q
data_dir = "data"
socket = "-"

[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q
risk = "LOW"
`, testkit.Build(t, testkit.MCPFixture))
	a := open(t, load(t, dir, fmt.Sprintf(src, "127.0.0.1:1")))
	front := httptest.NewServer(a.Handler())
	defer front.Close()
	tok := testkit.Mint(t, testSecret, token.Claims{Sub: "alice", ChatType: "private"})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var calls int
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// slow takes 3×30 ms upstream: some call is always in flight.
				status, _, b := testkit.PostMCP(t, front.URL, tok, "fx__slow",
					`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__slow","arguments":{"delay_ms":30},`+meta+`}}`)
				if status != 200 || !strings.Contains(string(b), `"done"`) || strings.Contains(string(b), `"isError":true`) {
					t.Errorf("a call during reloads: %d %.300s", status, b)
					return
				}
				mu.Lock()
				calls++
				mu.Unlock()
			}
		})
	}
	for i := range 3 {
		needs, err := a.Reload(context.Background(), load(t, dir, fmt.Sprintf(src, fmt.Sprintf("127.0.0.1:%d", 2+i))), nil)
		if err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		if len(needs) != 1 || needs[0] != "server.listen" {
			t.Errorf("reload %d needs a restart for %v; want [server.listen]", i, needs)
		}
	}
	close(stop)
	wg.Wait()
	if calls == 0 {
		t.Error("no call ran during the reloads")
	}
	if got := a.Server.Registry(); got != a.Registry {
		t.Errorf("the front door serves registry %p, the app holds %p", got, a.Registry)
	}
}
