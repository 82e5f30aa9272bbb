package router

import (
	"context"
	"encoding/json"
	"testing"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// TestGrantCheckEvents pins the grant_check record of each kind of
// caller, allowed and refused, word for word.
func TestGrantCheckEvents(t *testing.T) {
	ctx := context.Background()
	src := &swapSource{}
	src.set(`{"type":"object"}`, "a", "b")
	reg, err := registry.New(ctx, []tool.Source{src}, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	secret := []byte("event-test-secret")
	v, _ := token.NewVerifier(token.Options{Secret: secret})
	table, _ := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	rec := &recorder{}
	r, err := New(Options{Registry: reg, Verifier: v, Risk: table, State: st, Audit: rec, Policy: Policy{
		Grants:    []string{"rye.fetch.tool.*", "rye.execute.tool.mcp.swap.*"},
		Anonymous: &Subject{Sub: "anon", Grants: []string{"rye.execute.tool.mcp.swap.a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	caller := func(cl token.Claims) *Caller {
		raw, err := token.Mint(secret, cl, token.MintOptions{Ash: true})
		if err != nil {
			t.Fatal(err)
		}
		c, err := r.Authenticate(raw)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	plain := caller(token.Claims{Sub: "bob", ChatID: "c1", ChatType: " Private "})
	capped := caller(token.Claims{Sub: "carol", Caps: []string{"rye.fetch.tool.*", "rye.execute.tool.mcp.swap.a"}})
	scope := &Scope{Name: "notes", Grants: permissions.MustSet("rye.execute.tool.mcp.*")}
	const a, b = "rye.execute.tool.mcp.swap.a", "rye.execute.tool.mcp.swap.b"
	for _, tt := range []struct {
		c                     *Caller
		scope                 *Scope
		tool, required        string
		allowed               bool
		guarantee, reason     string
		sub, chatID, chatType string
	}{
		{plain, nil, "mcp:swap:a", a, true, "policy", a + " is allowed by grant rye.execute.tool.mcp.swap.*", "bob", "c1", "private"},
		{capped, nil, "swap__a", a, true, "token caps+policy", a + " is allowed by grants " + a + " and rye.execute.tool.mcp.swap.*", "carol", "", ""},
		{capped, nil, "swap__b", b, false, "token caps", b + " is denied: no grant of the attenuating (child) set matches it", "carol", "", ""},
		{capped, scope, "swap__a", a, true, "skill notes+token caps+policy", a + " is allowed by grants rye.execute.tool.mcp.* and " + a + " and rye.execute.tool.mcp.swap.*", "carol", "", ""},
		{plain, &Scope{Name: "x", Grants: permissions.MustSet("rye.fetch.*")}, "swap__b", b, false, "skill x", b + " is denied: no grant of the attenuating (child) set matches it", "bob", "c1", "private"},
		{r.Anonymous(), nil, "swap__a", a, true, "anonymous", a + " is allowed by grant " + a, "anon", "", ""},
	} {
		_, err := r.Call(ctx, tt.c, Request{Tool: tt.tool, Input: json.RawMessage(`{}`), Scope: tt.scope, Protocol: "p", RequestID: "7"})
		if (err == nil) != tt.allowed {
			t.Errorf("%s %s: %v", tt.sub, tt.tool, err)
		}
		rec.mu.Lock()
		evs := rec.events
		rec.events = nil
		rec.mu.Unlock()
		if len(evs) != 3 {
			t.Fatalf("%s %s: %d events", tt.sub, tt.tool, len(evs))
		}
		// The first is the call's invocation_start, at admission.
		if start := evs[0]; start.Type != audit.TypeInvocationStart || start.Sub != tt.sub || start.ToolName != tt.tool ||
			start.RequestID != "7" || start.Decision != "" {
			t.Errorf("%s %s: invocation_start %+v", tt.sub, tt.tool, start)
		}
		evs = evs[1:]
		decision := "deny"
		if tt.allowed {
			decision = "allow"
		}
		id := "mcp:swap:" + tt.required[len(tt.required)-1:]
		want := audit.Event{Type: audit.TypeGrantCheck, ToolName: "swap__" + id[len(id)-1:], Runner: "service", ResolvedSource: "binding",
			Kind: "mcp", Required: tt.required, Layer: tt.guarantee, Explanation: tt.reason, Protocol: "p",
			Sub: tt.sub, ChatID: tt.chatID, ChatType: tt.chatType, Tool: id, Decision: decision, Gate: GateCapability, RequestID: "7"}
		if evs[0] != want {
			t.Errorf("%s %s:\n got %+v\nwant %+v", tt.sub, tt.tool, evs[0], want)
		}
		if evs[1].Type != audit.TypeToolCall || evs[1].Decision != decision || evs[1].InputSHA256 != audit.HashInput([]byte("{}")) {
			t.Errorf("%s %s: tool call %+v", tt.sub, tt.tool, evs[1])
		}
	}
}
