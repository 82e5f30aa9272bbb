package sources

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources/bridge"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

func TestMain(m *testing.M) {
	testkit.Programs(testkit.BridgeFixture, testkit.MCPFixture)
	testkit.Main(m)
}

const (
	mcpFixture    = testkit.MCPFixture
	bridgeFixture = testkit.BridgeFixture
)

func build(t *testing.T, bo BuildOptions) *registry.Registry {
	t.Helper()
	r, err := Build(context.Background(), bo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func call(t *testing.T, r *registry.Registry, id, input string) (*tool.Result, error) {
	t.Helper()
	return r.Call(context.Background(), id, tool.Call{Input: json.RawMessage(input)})
}

// TestThreeSourceKinds builds a catalog from a config naming an extension
// pack directory, a bridge provider and an upstream MCP server, all real
// processes, and calls a tool of each.
func TestThreeSourceKinds(t *testing.T) {
	packs, _ := filepath.Abs("ext/testdata/packs")
	r := build(t, BuildOptions{
		ExtPaths: []string{packs},
		Bridges:  []Bridge{{Key: "capabilities.providers.gog", Options: bridge.Options{Namespace: "gog", Command: []string{testkit.Build(t, bridgeFixture)}}}},
		MCP: []MCPServer{{
			Key: "mcp.servers.fx", Options: mcp.Options{Name: "fx", Command: testkit.Build(t, mcpFixture)}, Prefix: "fx",
			Default: registry.Override{Level: risk.Med},
			Tools: map[string]registry.Override{
				"echo":   {Level: risk.Low, Name: "say"},
				"mutate": {Hidden: true},
			},
		}},
	})
	s := r.Snapshot()
	counts := map[tool.Kind]int{}
	for _, d := range s.Tools {
		counts[d.Kind]++
	}
	// ext: 8 + 1 commands; bridge: 3 operations; mcp: 28 less mutate.
	if counts[tool.KindExt] != 9 || counts[tool.KindBridge] != 3 || counts[tool.KindMCP] != 27 {
		t.Errorf("catalog by kind %v", counts)
	}
	say, ok := s.ByExposedName("say")
	if !ok || say.ID != "mcp:fx:echo" || say.Risk.Level.String() != "LOW" || say.Risk.LevelFrom != "operator" {
		t.Errorf("echo with operator overrides: %+v", say)
	}
	if d, _ := s.Lookup("mcp:fx:slow"); d.Risk.Level.String() != "MED" || d.ExposedName != "fx__slow" {
		t.Errorf("server default risk: %+v", d)
	}
	for id, input := range map[string]string{
		"ext:tools.echo:echo":            `{"msg":"x"}`,
		"bridge:gog:email.list_messages": `{}`,
		"mcp:fx:echo":                    `{"message":"x"}`,
	} {
		if _, err := call(t, r, id, input); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
}

// TestUpstreamKilledAndRestarted: while an upstream is down the other
// sources keep serving; when it comes back its tools return without
// restarting anything.
func TestUpstreamKilledAndRestarted(t *testing.T) {
	addr := testkit.FreeAddr(t)
	start := func() func() { return testkit.ServeMCPFixture(t, "-http", addr) }
	kill := start()
	packs, _ := filepath.Abs("ext/testdata/packs")
	r := build(t, BuildOptions{ExtPaths: []string{packs}, MCP: []MCPServer{{
		Options: mcp.Options{Name: "up", URL: "http://" + addr + "/mcp", Timeout: 3 * time.Second}, Prefix: "up",
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	if _, err := call(t, r, "mcp:up:echo", `{"message":"a"}`); err != nil {
		t.Fatal(err)
	}
	kill()
	if _, err := call(t, r, "mcp:up:echo", `{"message":"a"}`); tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Fatalf("call to the dead upstream: %v", err)
	}
	waitFor(t, "the upstream's tools to show as unavailable", func() bool {
		d, ok := r.Snapshot().Lookup("mcp:up:echo")
		return ok && !d.Available
	})
	if _, err := call(t, r, "ext:tools.echo:echo", `{"msg":"still here"}`); err != nil {
		t.Errorf("the extension pack stopped serving with the upstream down: %v", err)
	}
	start()
	waitFor(t, "the upstream's tools to come back", func() bool {
		d, ok := r.Snapshot().Lookup("mcp:up:echo")
		return ok && d.Available
	})
	if _, err := call(t, r, "mcp:up:echo", `{"message":"b"}`); err != nil {
		t.Errorf("call after the restart: %v", err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testkit.WaitFor(t, 15*time.Second, what, ok)
}

// everything installs @modelcontextprotocol/server-everything, pinned by
// testdata/everything/package-lock.json, once per machine and returns its
// binary. The tool count below is that version's.
func everything(t *testing.T) string {
	t.Helper()
	return filepath.Join(testkit.NPMCI(t, filepath.Join("testdata", "everything")), "node_modules", ".bin", "mcp-server-everything")
}

func TestServerEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("installs an npm package")
	}
	bin := everything(t)
	r := build(t, BuildOptions{MCP: []MCPServer{{
		Options: mcp.Options{Name: "everything", Command: bin, Args: []string{"stdio"}}, Prefix: "everything",
	}}})
	tools := r.Snapshot().List(registry.Filter{Kinds: []tool.Kind{tool.KindMCP}, AvailableOnly: true})
	// 13, plus the three it offers to clients that can answer sampling and
	// elicitation, as capgate says it can (it relays them to its caller).
	if len(tools) != 16 {
		var names []string
		for _, d := range tools {
			names = append(names, d.Name)
		}
		t.Fatalf("%d tools from server-everything, want 16: %v", len(tools), names)
	}
	res, err := call(t, r, "mcp:everything:echo", `{"message":"hello from capgate"}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Content) == 0 || !strings.Contains(string(res.Content[0]), "hello from capgate") {
		t.Errorf("echo answered %s", res.Content)
	}
}

// TestUpstreamChangeIsQuarantined pins the catalog, then has the upstream
// change echo's description (it sends tools/list_changed): echo becomes
// quarantined and cannot be called; the rest still can.
func TestUpstreamChangeIsQuarantined(t *testing.T) {
	lock := filepath.Join(t.TempDir(), registry.LockFile)
	bo := BuildOptions{MCP: []MCPServer{{Options: mcp.Options{Name: "fx", Command: testkit.Build(t, mcpFixture)}, Prefix: "fx"}}}
	first, err := Build(context.Background(), bo)
	if err != nil {
		t.Fatal(err)
	}
	if err := registry.WriteLock(lock, first.Snapshot().Tools); err != nil {
		t.Fatal(err)
	}
	first.Close()

	bo.LockPath = lock
	r, err := Build(context.Background(), bo)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	if _, err := r.Call(ctx, "mcp:fx:echo", tool.Call{Input: json.RawMessage(`{"message":"before"}`)}); err != nil {
		t.Fatalf("echo before the change: %v", err)
	}
	if _, err := r.Call(ctx, "mcp:fx:mutate", tool.Call{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo to be quarantined", func() bool {
		d, _ := r.Snapshot().Lookup("mcp:fx:echo")
		return d.Quarantined != ""
	})
	_, err = r.Call(ctx, "mcp:fx:echo", tool.Call{Input: json.RawMessage(`{"message":"after"}`)})
	if tool.ErrorCode(err) != tool.CodeAccessDenied || !strings.Contains(tool.ErrorMessage(err), "quarantined") {
		t.Errorf("quarantined echo: %v", err)
	}
	if _, err := r.Call(ctx, "mcp:fx:t_01", tool.Call{}); err != nil {
		t.Errorf("an unchanged tool: %v", err)
	}
	if _, err := r.Call(ctx, "mcp:fx:nope", tool.Call{}); tool.ErrorCode(err) != tool.CodeNotFound {
		t.Errorf("unknown tool: %v", err)
	}
}
