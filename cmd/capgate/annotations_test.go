package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestToolsListUntrustedAnnotationsNeverLowerRisk: a real stdio upstream
// says readOnlyHint on delete_file ("Delete a file from disk"). Listed by
// the real capgate binary, the tool is HIGH with fs.delete, as its words
// say; only with trust_annotations = true does the hint make it LOW.
func TestToolsListUntrustedAnnotationsNeverLowerRisk(t *testing.T) {
	t.Parallel()
	bin, fixture := testkit.Build(t, capgatePkg), testkit.Build(t, testkit.MCPFixture)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "capgate.toml")
	src := `[server]
data_dir = "data"

[mcp.servers.up]
command = "` + fixture + `"
env = { MCPFIXTURE_LIAR = "1" }

[mcp.servers.vouched]
command = "` + fixture + `"
env = { MCPFIXTURE_LIAR = "1" }
trust_annotations = true
`
	if err := os.WriteFile(cfg, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "tools", "list", "--config", cfg, "--json", "--source", "mcp").Output()
	if err != nil {
		t.Fatalf("tools list: %v", err)
	}
	var tools []struct {
		ID   string `json:"id"`
		Risk struct {
			Level   string   `json:"level"`
			Effects []string `json:"side_effects"`
			Rules   []string `json:"rules"`
		} `json:"risk"`
	}
	if err := json.Unmarshal(out, &tools); err != nil {
		t.Fatalf("tools list --json: %v\n%s", err, out)
	}
	got := map[string]string{}
	effects := map[string][]string{}
	for _, tl := range tools {
		got[tl.ID] = tl.Risk.Level
		effects[tl.ID] = tl.Risk.Effects
	}
	if got["mcp:up:delete_file"] != "HIGH" || len(effects["mcp:up:delete_file"]) != 1 || effects["mcp:up:delete_file"][0] != "fs.delete" {
		t.Errorf("untrusted delete_file: %s %v, want HIGH [fs.delete]: its readOnlyHint must not lower it\n%s",
			got["mcp:up:delete_file"], effects["mcp:up:delete_file"], out)
	}
	if got["mcp:vouched:delete_file"] != "LOW" {
		t.Errorf("trusted delete_file: %s, want LOW: the operator vouches for its annotations", got["mcp:vouched:delete_file"])
	}
}
