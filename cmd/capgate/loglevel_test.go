//go:build linux

package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestLogLevel: serve --log-level warn leaves out the info line per call
// (which costs 3.5-7% of a call's CPU at concurrency 1) while the audit
// still records the call; a level that is none is refused by name.
func TestLogLevel(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--log-level", "loud", "--config", "/nonexistent.toml"}, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), `--log-level "loud": use debug, info, warn or error`) {
		t.Errorf("--log-level loud: exit %d\n%s%s", code, out.String(), errb.String())
	}

	cg := testkit.StartCapgate(t, testkit.Capgate{Args: []string{"--log-level", "warn"}, Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q

[mcp.servers.fx.tools.t_00]
risk = "LOW"
`, testkit.Build(t, testkit.MCPFixture))})
	s := fromCapgate(cg)
	tok := s.mint(t, "alice", "private")
	if a := s.invokeRaw(t, tok, "mcp:fx:t_00", `{}`, ""); a.Code != "" {
		t.Fatalf("the call: %+v", a)
	}
	if a := s.invokeRaw(t, tok, "mcp:fx:nothing_here", `{}`, ""); a.Code == "" {
		t.Fatalf("a call of no tool answered %+v", a)
	}
	cg.Stop(t) // serve writes what it gathered as it exits
	if logs := cg.Logs(); strings.Contains(logs, "msg=call") {
		t.Errorf("--log-level warn logged the calls:\n%s", logs)
	}
	if recs := auditRecords(t, s, record("tool_call", "mcp:fx:t_00")); len(recs) != 1 {
		t.Errorf("the audit holds %d tool_call records of the call, want 1", len(recs))
	}
}
