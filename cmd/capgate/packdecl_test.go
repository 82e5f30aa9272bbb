//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// TestPackLevelGuarantees: an extension pack's top-level capabilities hold
// for each of its commands (namel3ss declares guarantees per pack), each
// guarantee they make is from "pack", a command's own declaration adds to
// them and cannot loosen them, and the kernel enforces them: through a real
// capgate serve, the socket a command opens is refused, recorded as a
// capability_check whose guarantee_source is pack and resolved_source
// installed_pack, and tools show gives the flat form beside the rich one.
func TestPackLevelGuarantees(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 || !f.Seccomp || (!f.NetNS && f.LandlockABI < 4) {
		t.Skipf("this kernel cannot enforce the guarantees: %+v", f)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	dial := "tcp=" + ln.Addr().String()
	pack := filepath.Join(t.TempDir(), "np")
	writeFile(t, filepath.Join(pack, "extension.yaml"), fmt.Sprintf(`id: np
name: No network
description: Every command without the network
capabilities:
  network: none
commands:
  dial:
    description: Dial out
    run: [%[1]q, "--json", %[2]q]
    risk: LOW
  loose:
    description: Dial out, declaring it may
    run: [%[1]q, "--json", %[2]q]
    risk: LOW
    capabilities:
      network: outbound
      filesystem: read
`, hostile, dial))
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.ext.np.*"]

[extensions]
paths = [%q]
`, filepath.Dir(pack))})
	s := fromCapgate(cg)

	want := map[string]map[string]string{
		"ext:np:dial":  {"no_network": "pack"},
		"ext:np:loose": {"no_filesystem_write": "tool", "no_network": "pack"},
	}
	for id, keys := range want {
		out, errb, code := s.run(t, nil, "tools", "show", id, "--config", s.config)
		var d tool.Descriptor
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Guarantees == nil {
			t.Fatalf("tools show %s: %d %s %s", id, code, out, errb)
		}
		got := map[string]string{}
		for _, k := range d.Guarantees.Keys {
			got[k.Key] = k.Source
		}
		if fmt.Sprint(got) != fmt.Sprint(keys) {
			t.Errorf("%s: guarantees %v, want %v", id, got, keys)
		}
		for _, k := range sandbox.Keys {
			if _, held := keys[string(k)]; d.Guarantees.Flat[string(k)] != held {
				t.Errorf("%s: flat %v, want true exactly for %v", id, d.Guarantees.Flat, keys)
			}
		}
	}

	tok := s.mint(t, "alice", "private")
	for _, id := range []string{"ext:np:dial", "ext:np:loose"} {
		out, errb, code := s.as(t, tok, "invoke", "--capability", id)
		if code != 0 || !strings.Contains(out, fmt.Sprintf("%q: \"denied", dial)) {
			t.Fatalf("%s: the pack's network none did not hold: %d %s %s", id, code, out, errb)
		}
		checks := auditRecords(t, s, record("capability_check", id))
		if len(checks) != 1 {
			t.Fatalf("%s: capability_check records %v", id, checks)
		}
		c := checks[0]
		if c["capability"] != "network" || c["guarantee_source"] != "pack" || c["resolved_source"] != "installed_pack" ||
			c["runner"] != "local" || c["reason"] != "guarantee_blocked" {
			t.Errorf("%s: capability_check %v", id, c)
		}
		calls := auditRecords(t, s, record("tool_call", id))
		g, _ := calls[0]["guarantees"].(map[string]any)
		flat, _ := g["flat"].(map[string]any)
		if calls[0]["resolved_source"] != "installed_pack" || flat["no_network"] != true || flat["no_subprocess"] != false {
			t.Errorf("%s: tool_call %v", id, calls[0])
		}
	}
}
