package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// planAnswer is a planning call's answer over /rpc.
type planAnswer struct {
	OK   bool   `json:"ok"`
	Mode string `json:"mode"`
	Plan struct {
		Tool    string `json:"tool"`
		Allowed bool   `json:"allowed"`
		Denial  *struct {
			Code, Gate, Required, Message, Hint string
		} `json:"denial"`
		Risk *struct {
			Level       string   `json:"level"`
			SideEffects []string `json:"side_effects"`
			Tier        string   `json:"tier"`
			// SideEffectPolicies: [policy.side_effects] for the tool.
			SideEffectPolicies []struct {
				Effect       string `json:"effect"`
				Policy       string `json:"policy"`
				Acknowledged bool   `json:"acknowledged"`
			} `json:"side_effect_policies"`
		} `json:"risk"`
		ApprovalNeeded bool   `json:"approval_needed"`
		ApprovalReady  bool   `json:"approval_ready"`
		RateLimit      string `json:"rate_limit"`
		Guarantees     struct {
			Source string   `json:"source"`
			Layers []string `json:"layers"`
		} `json:"guarantees"`
	} `json:"plan"`
}

// planRPC posts capability.invoke with mode "planning".
func (s *served) planRPC(t *testing.T, tok, tool, input, key string) planAnswer {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":"` + tok +
		`","mode":"planning","capability":"` + tool + `","idempotency_key":"` + key + `","input":` + input + `}}`
	resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Result *planAnswer `json:"result"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Result == nil || r.Result.Mode != "planning" {
		t.Fatalf("planning %s: no planning result: %v %s", tool, err, b)
	}
	return *r.Result
}

// TestPlanningRunsNothing: planning calls over /rpc and over /mcp (the
// fast call's shape and mcp-go's) answer with every gate's decision and
// run nothing, request no approval, claim no idempotency key and take no
// rate-limit token; each is audited as a plan record.
func TestPlanningRunsNothing(t *testing.T) {
	t.Parallel()
	extra, log := callsPack(t)
	// One token a minute: under load the calls below took over the 5 s
	// that 12 a minute gave to refill one.
	s := startServe(t, extra+"\n[policy.rate_limit]\nper_minute = 1\nburst = 2\n")
	alice, carol := s.mint(t, "alice", "private"), s.mint(t, "carol", "private")
	plans := 0

	// Allowed: the decision, risk and guarantees; four times, more than
	// the burst, with the idempotency key the real call uses below.
	for range 4 {
		a := s.planRPC(t, alice, "ext:calls:record", `{"note":"n1"}`, "k1")
		plans++
		p := a.Plan
		if !a.OK || !p.Allowed || p.Denial != nil || p.Tool != "ext:calls:record" || p.RateLimit != "ok" ||
			p.Risk == nil || p.Risk.Level != "LOW" || p.Risk.Tier == "" || p.ApprovalNeeded ||
			p.Guarantees.Source == "" || len(p.Guarantees.Layers) == 0 {
			t.Fatalf("allowed plan: %+v", a)
		}
	}
	// Denied at the capability gate: code, gate, what is required.
	a := s.planRPC(t, carol, "ext:calls:record", `{"note":"n1"}`, "")
	plans++
	if d := a.Plan.Denial; a.OK || a.Plan.Allowed || d == nil || d.Code != "permission_denied" || d.Gate != "capability" ||
		d.Required != "rye.execute.tool.ext.calls.record" || d.Hint == "" || a.Plan.RateLimit != "not checked" {
		t.Fatalf("denied plan: %+v", a)
	}
	// CRITICAL: approval needed, and no approval is requested.
	a = s.planRPC(t, alice, "ext:calls:danger", `{"cmd":"ls"}`, "")
	plans++
	if d := a.Plan.Denial; a.OK || d == nil || d.Code != "approval_required" || d.Gate != "approval" ||
		!a.Plan.ApprovalNeeded || a.Plan.ApprovalReady || a.Plan.Risk == nil || a.Plan.Risk.Level != "CRITICAL" {
		t.Fatalf("CRITICAL plan: %+v", a)
	}
	if got := s.liveApprovals(t); len(got) != 0 {
		t.Fatalf("a planning call requested an approval: %v", got)
	}

	// Over /mcp: the fast call's shape, then mcp-go's (a progress token).
	meta := `"_meta":{"capgate/mode":"planning","io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
	for _, path := range []struct{ name, meta string }{
		{"the fast call", meta},
		{"mcp-go's path", strings.Replace(meta, `"_meta":{`, `"_meta":{"progressToken":"p1",`, 1)},
	} {
		for _, c := range []struct {
			tool, args, isError, want string
		}{
			{"calls__record", `{"note":"n1"}`, "false", `"allowed":true`},
			{"calls__danger", `{"cmd":"ls"}`, "true", `"code":"approval_required"`},
		} {
			body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + c.tool + `","arguments":` + c.args + `,` + path.meta + `}}`
			status, _, b := testkit.PostMCP(t, "http://"+s.addr, alice, c.tool, body)
			plans++
			var r struct {
				Result struct {
					IsError    bool            `json:"isError"`
					Structured json.RawMessage `json:"structuredContent"`
				} `json:"result"`
			}
			if i := strings.Index(string(b), "{"); i >= 0 {
				_ = json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(string(b[i:]), "data: "))), &r)
			}
			if status != http.StatusOK || (r.Result.IsError != (c.isError == "true")) ||
				!strings.Contains(string(r.Result.Structured), c.want) || !strings.Contains(string(r.Result.Structured), `"rate_limit"`) {
				t.Errorf("over /mcp, %s, %s: %d %s", path.name, c.tool, status, b)
			}
		}
	}
	if got := runs(t, log); len(got) != 0 {
		t.Fatalf("planning calls ran the tool: %q", got)
	}
	if got := s.liveApprovals(t); len(got) != 0 {
		t.Fatalf("a planning call over /mcp requested an approval: %v", got)
	}

	// The key planning named is not claimed, and the burst of two is
	// whole: two real calls run, the third is limited; then planning
	// reports the limit.
	if r := s.invokeRaw(t, alice, "ext:calls:record", `{"note":"n1"}`, "k1"); r.Code != "" {
		t.Fatalf("the real call after planning with its key: %+v", r)
	}
	if r := s.invokeRaw(t, alice, "ext:calls:record", `{"note":"n2"}`, "k2"); r.Code != "" {
		t.Fatalf("the second real call (planning took rate-limit tokens?): %+v", r)
	}
	if r := s.invokeRaw(t, alice, "ext:calls:record", `{"note":"n3"}`, "k3"); r.Code != "rate_limited" {
		t.Fatalf("the third real call: %+v, want rate_limited", r)
	}
	a = s.planRPC(t, alice, "ext:calls:record", `{"note":"n4"}`, "")
	plans++
	if d := a.Plan.Denial; a.OK || d == nil || d.Code != "rate_limited" || d.Gate != "rate_limit" || a.Plan.RateLimit != "limited" {
		t.Fatalf("plan once limited: %+v", a)
	}
	if got := runs(t, log); len(got) != 2 {
		t.Fatalf("runs %q, want the two real calls", got)
	}

	// The audit log: one plan record per planning call, none a tool_call.
	// Records are group-committed: wait a little for the last ones.
	var got string
	if !testkit.Poll(30*time.Second, func() bool {
		planned, allowed, approval, toolCalls := auditCounts(t, filepath.Join(s.dir, "data", "audit.jsonl"))
		got = fmt.Sprintf("%d plan records (want %d), %d allowed for record (want 6), %d approval_required (want 3), %d tool_call (want 3)",
			planned, plans, allowed, approval, toolCalls)
		return planned == plans && allowed == 6 && approval == 3 && toolCalls == 3
	}) {
		t.Fatalf("audit: %s", got)
	}
}

// auditCounts counts an audit log's plan records (all; allowed for
// alice's ext:calls:record; refused for ext:calls:danger's approval) and
// its tool_call records.
func auditCounts(t *testing.T, path string) (planned, allowed, approval, toolCalls int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct{ Type, Sub, Tool, Decision, Gate, Code string }
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		switch e.Type {
		case "plan":
			planned++
			if e.Decision == "allow" && e.Tool == "ext:calls:record" && e.Sub == "alice" {
				allowed++
			}
			if e.Decision == "deny" && e.Code == "approval_required" && e.Gate == "approval" && e.Tool == "ext:calls:danger" {
				approval++
			}
		case "tool_call":
			toolCalls++
		}
	}
	return planned, allowed, approval, toolCalls
}
