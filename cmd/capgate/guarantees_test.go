//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// guaranteesFixture serves an extension pack with a command that declares
// network none, one undeclared that the operator tightens, and one left
// undeclared; a stdio MCP server declaring filesystem none; a bridge
// provider declaring subprocess none; and a trust ceiling of env none.
func guaranteesFixture(t *testing.T, extra string) *served {
	t.Helper()
	f := sandbox.Probe()
	if f.LandlockABI < 1 || !f.Seccomp || (!f.NetNS && f.LandlockABI < 4) {
		t.Skipf("this kernel cannot enforce the guarantees: %+v", f)
	}
	pack := filepath.Join(t.TempDir(), "probe")
	if err := os.MkdirAll(pack, 0o755); err != nil {
		t.Fatal(err)
	}
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	cmd := func(name, caps string) string {
		return fmt.Sprintf("  %s:\n    description: Print its environment\n    run: [%q, \"--json\", \"env\"]\n    risk: LOW\n%s", name, hostile, caps)
	}
	manifest := "id: probe\nname: Probe\ndescription: Hostile commands\ncommands:\n" +
		cmd("sealed", "    capabilities:\n      network: none\n") + cmd("tightened", "") + cmd("open", "")
	if err := os.WriteFile(filepath.Join(pack, "extension.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

[capability_overrides."ext:probe:tightened"]
no_subprocess = true

[trust]
allowed_capabilities = { env = "read" }

[capabilities.providers.gog]
command = [%q]
capabilities = { subprocess = "none" }

[mcp.servers.sealed]
command = %q
capabilities = { filesystem = "none" }
%s`, filepath.Dir(pack), testkit.Build(t, testkit.BridgeFixture), testkit.Build(t, testkit.MCPFixture), extra)})
	return fromCapgate(cg)
}

// TestGuaranteesAreVisible: each tool's effective guarantees, where each
// came from and whether this kernel enforces it, are in tools/list's _meta
// (with openWorldHint false under an enforced no_network), in tools show
// and in tools list --json.
func TestGuaranteesAreVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	s := guaranteesFixture(t, "")
	want := map[string]map[string]string{ // tool id → key → source
		"ext:probe:sealed":                {"no_network": "tool", "no_env_write": "policy"},
		"ext:probe:tightened":             {"no_subprocess": "user", "no_env_write": "policy"},
		"ext:probe:open":                  {"no_env_write": "policy"},
		"bridge:gog:calendar.list_events": {"no_subprocess": "tool", "no_env_write": "policy"},
		"mcp:sealed:echo":                 {"no_filesystem_read": "tool", "no_filesystem_write": "tool", "no_env_write": "policy"},
	}
	check := func(where, id string, g *tool.Guarantees) {
		t.Helper()
		if g == nil {
			t.Errorf("%s: %s has no guarantees", where, id)
			return
		}
		got := map[string]string{}
		for _, k := range g.Keys {
			got[k.Key] = k.Source
			if !k.Enforced || k.Missing != "" {
				t.Errorf("%s: %s: %s not enforced (%s)", where, id, k.Key, k.Missing)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[id]) || g.Runner != "local" || !g.Enforced {
			t.Errorf("%s: %s: guarantees %+v, want keys %v, runner local, enforced", where, id, g, want[id])
		}
	}

	// tools/list over MCP.
	tok := testkit.Mint(t, s.secret, token.Claims{Sub: "alice", ChatType: "private"})
	c := s.mcpAs(t, tok)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mt := range res.Tools {
		id, _ := mt.Meta.AdditionalFields["capgate/tool_id"].(string)
		if _, ok := want[id]; !ok {
			continue
		}
		seen[id] = true
		raw, _ := json.Marshal(mt.Meta.AdditionalFields["capgate/guarantees"])
		var g *tool.Guarantees
		if err := json.Unmarshal(raw, &g); err != nil {
			t.Fatalf("%s: _meta capgate/guarantees: %v: %s", id, err, raw)
		}
		check("tools/list", id, g)
		// The pack's commands say nothing of the network: only the
		// kernel's proof closes the world.
		open := mt.Annotations.OpenWorldHint
		if wantOpen := id != "ext:probe:sealed"; strings.HasPrefix(id, "ext:") && (open == nil || *open != wantOpen) {
			t.Errorf("tools/list: %s: openWorldHint %v, want %v", id, open, wantOpen)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("tools/list: saw %v of %d tools", seen, len(want))
	}

	// The CLI: tools show and tools list --json.
	for id := range want {
		out, errb, code := s.run(t, nil, "tools", "show", id, "--config", s.config)
		var d tool.Descriptor
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil {
			t.Fatalf("tools show %s: %d %s %s", id, code, out, errb)
		}
		check("tools show", id, d.Guarantees)
	}
	out, errb, code := s.run(t, nil, "tools", "list", "--json", "--config", s.config)
	var list []tool.Descriptor
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("tools list --json: %d %s %s", code, out, errb)
	}
	for _, d := range list {
		if _, ok := want[d.ID]; ok {
			check("tools list --json", d.ID, d.Guarantees)
		}
	}
}
