//go:build linux

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestSideEffectPolicy: [policy.side_effects] decides calls by the tool's
// side-effect tags, through the gate chain of a real capgate serve: a
// denied tag refuses everyone, an acknowledged one needs the caller's
// acknowledgement of the tag (the policy's, narrowed by the token's ack
// claim), on /rpc and /mcp alike; planning names the gate and shows the
// policies without running anything; the refusal is audited with its gate.
func TestSideEffectPolicy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	root := t.TempDir()
	dir := filepath.Join(root, "fx")
	log := filepath.Join(testkit.ToolDir(t), "runs.log") // the tools run as nobody under root
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "bin", "run"), "#!/bin/sh\ncat >/dev/null\necho \"$1\" >> "+shellQuote(log)+"\necho '{\"ok\": true}'\n")
	if err := os.Chmod(filepath.Join(dir, "bin", "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "extension.yaml"), `id: fx
name: Effects
description: Tools with declared side effects
commands:
  wipe:
    description: Remove a scratch file
    run: ["./bin/run", "wipe"]
    risk: LOW
    side_effects: [fs.write, fs.delete]
  pay:
    description: Send a payment
    run: ["./bin/run", "pay"]
    risk: LOW
    side_effects: [fs.delete, payments]
  look:
    description: Read a scratch file
    run: ["./bin/run", "look"]
    risk: LOW
    side_effects: [fs.read]
`)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[extensions]
paths = [%q]

[policy]
grants = ["rye.execute.tool.ext.fx.*", "rye.fetch.*"]

[policy.side_effects]
"fs.delete" = "acknowledge"
"payments" = "deny"
"fs.read" = "allow"

[policy.subjects.alice]
acknowledge = ["fs.delete"]
`, root)})
	s := fromCapgate(cg)
	alice := s.mint(t, "alice", "private")
	bob := s.mint(t, "bob", "private")
	// alice's token acknowledges only "elevated": the policy's fs.delete
	// does not stand for it.
	aliceNarrow := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private", Ack: []string{"elevated"}})

	ran := func() string {
		b, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}

	// Not acknowledged: refused at the side_effects gate, nothing runs.
	for _, tok := range []string{bob, aliceNarrow} {
		a := s.invokeRaw(t, tok, "ext:fx:wipe", `{}`, "")
		if a.Code != "acknowledge_required" || !strings.Contains(a.Message, "fs.delete") {
			t.Fatalf("wipe without acknowledging fs.delete: %+v", a)
		}
	}
	// Denied for everyone, alice included, though she acknowledges the
	// tool's other tag: the denial is what she is told.
	a := s.invokeRaw(t, alice, "ext:fx:pay", `{}`, "")
	if a.Code != "capability_access_denied" || !strings.Contains(a.Message, "payments") {
		t.Fatalf("pay: %+v", a)
	}
	if got := ran(); got != "" {
		t.Fatalf("a refused call ran: %q", got)
	}
	// Acknowledged: runs. An allowed tag decides nothing.
	if a := s.invokeRaw(t, alice, "ext:fx:wipe", `{}`, ""); a.Code != "" {
		t.Fatalf("alice wipe: %+v", a)
	}
	if a := s.invokeRaw(t, bob, "ext:fx:look", `{}`, ""); a.Code != "" {
		t.Fatalf("bob look: %+v", a)
	}
	if got := ran(); got != "wipe\nlook" {
		t.Fatalf("runs: %q, want wipe then look", got)
	}

	// Over /mcp, the same gate.
	body := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fx__wipe","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	status, _, b := testkit.PostMCP(t, "http://"+s.addr, bob, "fx__wipe", body)
	if status != http.StatusOK || !strings.Contains(string(b), `"isError":true`) || !strings.Contains(string(b), "acknowledge_required") ||
		!strings.Contains(string(b), "fs.delete") {
		t.Fatalf("mcp wipe as bob: %d %s", status, b)
	}

	// Planning: the gate that would stop the call, and the policies.
	p := s.planRPC(t, bob, "ext:fx:wipe", `{}`, "")
	if d := p.Plan.Denial; p.Plan.Allowed || d == nil || d.Code != "acknowledge_required" || d.Gate != "side_effects" ||
		d.Required != "fs.delete" || !strings.Contains(d.Hint, `acknowledge "fs.delete"`) {
		t.Fatalf("plan wipe as bob: %+v", p)
	}
	p = s.planRPC(t, alice, "ext:fx:pay", `{}`, "")
	if d := p.Plan.Denial; p.Plan.Allowed || d == nil || d.Code != "capability_access_denied" || d.Gate != "side_effects" || d.Required != "payments" {
		t.Fatalf("plan pay as alice: %+v", p)
	}
	if got := fmt.Sprint(p.Plan.Risk.SideEffectPolicies); got != "[{fs.delete acknowledge true} {payments deny false}]" {
		t.Fatalf("plan pay as alice: side_effect_policies %s", got)
	}
	if p = s.planRPC(t, alice, "ext:fx:wipe", `{}`, ""); !p.Plan.Allowed {
		t.Fatalf("plan wipe as alice: %+v", p)
	}
	if got := ran(); got != "wipe\nlook" {
		t.Fatalf("planning ran a tool: %q", got)
	}

	// Audited: the refusal names its gate and what it required.
	recs := auditRecords(t, s, func(m map[string]any) bool {
		return m["type"] == "tool_call" && m["tool"] == "ext:fx:pay" && m["gate"] == "side_effects"
	})
	if len(recs) != 1 || recs[0]["decision"] != "deny" || recs[0]["code"] != "capability_access_denied" {
		t.Fatalf("audit of the denied pay: %v", recs)
	}
}
