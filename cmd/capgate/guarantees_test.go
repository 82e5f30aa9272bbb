//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	cmd := func(name, caps string) string {
		return fmt.Sprintf("  %s:\n    description: Print its environment\n    run: [%q, \"--json\", \"env\"]\n    risk: LOW\n%s", name, hostile, caps)
	}
	manifest := "id: probe\nname: Probe\ndescription: Hostile commands\ncommands:\n" +
		cmd("sealed", "    capabilities:\n      network: none\n") + cmd("tightened", "") + cmd("open", "") +
		cmd("pure", "    purity: pure\n")
	writeFile(t, filepath.Join(pack, "extension.yaml"), manifest)
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
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	s := guaranteesFixture(t, "")
	want := map[string]map[string]string{ // tool id → key → source
		"ext:probe:sealed":    {"no_network": "tool", "no_env_write": "policy"},
		"ext:probe:tightened": {"no_subprocess": "user", "no_env_write": "policy"},
		"ext:probe:open":      {"no_env_write": "policy"},
		"ext:probe:pure": {"no_filesystem_read": "tool", "no_filesystem_write": "tool", "no_network": "tool",
			"no_subprocess": "tool", "no_env_read": "tool", "no_env_write": "tool"},
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
		// namel3ss's flat form beside it: every key, true where held.
		if len(g.Flat) != len(sandbox.Keys) {
			t.Errorf("%s: %s: flat %v, want all %d keys", where, id, g.Flat, len(sandbox.Keys))
		}
		for _, k := range sandbox.Keys {
			if _, held := want[id][string(k)]; g.Flat[string(k)] != held {
				t.Errorf("%s: %s: flat %s = %v, want %v", where, id, k, g.Flat[string(k)], held)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[id]) || g.Runner != "local" || !g.Enforced || g.Pure != (id == "ext:probe:pure") {
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
		if wantOpen := id != "ext:probe:sealed" && id != "ext:probe:pure"; strings.HasPrefix(id, "ext:") && (open == nil || *open != wantOpen) {
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

// auditRecords waits for serve's audit log to hold a record matching
// keep, and returns every such record.
func auditRecords(t *testing.T, s *served, keep func(map[string]any) bool) []map[string]any {
	t.Helper()
	var out []map[string]any
	if testkit.Poll(10*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(s.dir, "data", "audit.jsonl"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		out = out[:0]
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && keep(m) {
				out = append(out, m)
			}
		}
		return len(out) > 0
	}) {
		return out
	}
	return nil
}

func record(typ, tool string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["type"] == typ && m["tool"] == tool }
}

// TestGuaranteesAreAudited: a confined tool's tool_call record holds its
// guarantees, and an unconfined one's none.
func TestGuaranteesAreAudited(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	s := guaranteesFixture(t, "")
	tok := testkit.Mint(t, s.secret, token.Claims{Sub: "alice", ChatType: "private"})
	for _, id := range []string{"ext:probe:sealed", "gog.calendar"} {
		args := []string{"invoke", "--capability", id}
		if id == "gog.calendar" {
			args = append(args, "--operation", "list_events")
		}
		if out, errb, code := s.as(t, tok, args...); code != 0 {
			t.Fatalf("invoke %s: %d %s %s", id, code, out, errb)
		}
	}
	for id, want := range map[string]string{
		"ext:probe:sealed":                `{"runner":"local","keys":[{"key":"no_network","source":"tool","enforced":true},{"key":"no_env_write","source":"policy","enforced":true}],"secrets_allowed":[],"secrets_source":"tool","enforced":true,"flat":{"no_env_read":false,"no_env_write":true,"no_filesystem_read":false,"no_filesystem_write":false,"no_network":true,"no_subprocess":false}}`,
		"bridge:gog:calendar.list_events": `{"runner":"local","keys":[{"key":"no_subprocess","source":"tool","enforced":true},{"key":"no_env_write","source":"policy","enforced":true}],"secrets_allowed":[],"secrets_source":"tool","enforced":true,"flat":{"no_env_read":false,"no_env_write":true,"no_filesystem_read":false,"no_filesystem_write":false,"no_network":false,"no_subprocess":true}}`,
	} {
		recs := auditRecords(t, s, record("tool_call", id))
		if len(recs) != 1 {
			t.Fatalf("%s: %d tool_call records", id, len(recs))
		}
		var w any
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(recs[0]["guarantees"], w) || recs[0]["runner"] != "local" || recs[0]["decision"] != "allow" {
			t.Errorf("%s: tool_call record %v\nwant guarantees %s", id, recs[0], want)
		}
	}
	if out, errb, code := s.run(t, nil, "audit", "verify", "--config", s.config); code != 0 {
		t.Errorf("audit verify: %d %s %s", code, out, errb)
	}
}

// TestUnenforceableGuaranteeIsACapabilityCheck runs serve on a kernel
// without Landlock (a seccomp filter refuses it, as older container
// profiles do): a tool declaring filesystem none is listed as not
// enforced and refused at launch, and the refusal is a capability_check
// record in the trace's schema; the operator's allow_unsafe_execution
// runs the same command, its record saying the guarantees were unproven.
func TestUnenforceableGuaranteeIsACapabilityCheck(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if sandbox.Probe().LandlockABI < 1 {
		t.Skip("needs Landlock, to take it away")
	}
	pack := filepath.Join(t.TempDir(), "probe")
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	manifest := fmt.Sprintf(`id: probe
name: Probe
description: Hostile commands
commands:
  sealed:
    description: Print an id
    run: [%[1]q, "--json", "id"]
    risk: LOW
    capabilities: {filesystem: none}
  unsafe:
    description: Print an id
    run: [%[1]q, "--json", "id"]
    risk: LOW
    capabilities: {filesystem: none}
`, hostile)
	writeFile(t, filepath.Join(pack, "extension.yaml"), manifest)
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Wrap: []string{testkit.Build(t, testkit.NoLandlock)}, Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]

[capability_overrides."ext:probe:unsafe"]
allow_unsafe_execution = true
`, filepath.Dir(pack))}))
	tok := testkit.Mint(t, s.secret, token.Claims{Sub: "alice", ChatType: "private"})

	out, errb, code := s.as(t, tok, "invoke", "--capability", "ext:probe:sealed")
	if code == 0 || !strings.Contains(out+errb, "capability_backend_unavailable") || !strings.Contains(out+errb, "Landlock") {
		t.Fatalf("an unenforceable tool ran, or was refused without naming Landlock: %d %s %s", code, out, errb)
	}
	checks := auditRecords(t, s, record("capability_check", "ext:probe:sealed"))
	if len(checks) != 1 {
		t.Fatalf("%d capability_check records", len(checks))
	}
	c := checks[0]
	want := map[string]any{"type": "capability_check", "tool_name": "probe__sealed", "runner": "local",
		"resolved_source": "installed_pack", "capability": "filesystem_write", "allowed": false, "guarantee_source": "tool",
		"reason": "guarantee_blocked", "protocol_version": 1.0}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("capability_check %s = %v (%T), want %v", k, c[k], c[k], v)
		}
	}
	if d, _ := c["detail"].(string); !strings.Contains(d, "no_filesystem_write needs Landlock") || !strings.Contains(d, "no_filesystem_read needs Landlock") {
		t.Errorf("capability_check detail %q does not name each missing feature", d)
	}

	if out, errb, code := s.as(t, tok, "invoke", "--capability", "ext:probe:unsafe"); code != 0 || !strings.Contains(out, `"id": "ok `) {
		t.Fatalf("allow_unsafe_execution did not run the tool: %d %s %s", code, out, errb)
	}
	calls := auditRecords(t, s, record("tool_call", "ext:probe:unsafe"))
	if len(calls) != 1 {
		t.Fatalf("the unsafe call's records: %v", calls)
	}
	g, _ := calls[0]["guarantees"].(map[string]any)
	if g["enforced"] != false || g["allow_unsafe_execution"] != true || calls[0]["decision"] != "allow" {
		t.Errorf("the unsafe call's record: %v", calls)
	}

	// tools show, on the same kernel, says so too.
	show, err := exec.Command(testkit.Build(t, testkit.NoLandlock), s.bin, "tools", "show", "ext:probe:sealed", "--config", s.config).Output()
	var d tool.Descriptor
	if err != nil || json.Unmarshal(show, &d) != nil {
		t.Fatalf("tools show: %v %s", err, show)
	}
	if k, ok := d.Guarantees.Get("no_filesystem_read"); d.Guarantees.Enforced || !ok || k.Enforced || k.Missing != "Landlock" {
		t.Errorf("tools show under a kernel without Landlock: %+v", d.Guarantees)
	}
}
