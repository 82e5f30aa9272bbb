package router

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// effectSource is an in-process source of one tool per side-effect set.
type effectSource struct{ countSource }

func (*effectSource) List(context.Context) ([]*tool.Descriptor, error) {
	var out []*tool.Descriptor
	for name, effects := range map[string][]risk.SideEffect{
		"wipe": {risk.FSWrite, risk.FSDelete},
		"pay":  {risk.FSDelete, risk.Payments},
		"env":  {risk.SystemEnv},
	} {
		out = append(out, &tool.Descriptor{ID: tool.ID(tool.KindMCP, "cnt", name), Kind: tool.KindMCP, Source: "cnt",
			Name: name, Available: true, InputSchema: json.RawMessage(`{"type":"object"}`),
			Risk: risk.Assessment{Level: risk.Low, Effects: effects}})
	}
	return out, nil
}

// The side_effects gate: a denial wins over a missing acknowledgement
// whatever the tags' order, a policy word it does not know refuses (fail
// closed), an acknowledged tag lets the call run, and a plan reports the
// same refusal with the tool's policies.
func TestSideEffectsGate(t *testing.T) {
	src := &effectSource{}
	r := leaseRouter(t, src, leaseStore(t), func(o *Options) {
		o.Policy.Anonymous.Acknowledge = []string{"fs.delete"}
		o.Policy.SideEffects = map[risk.SideEffect]risk.EffectPolicy{
			risk.FSDelete: risk.EffectAcknowledge, risk.Payments: risk.EffectDeny, risk.SystemEnv: "ask-me",
		}
	})
	call := func(name string) error {
		_, err := r.Call(context.Background(), r.Anonymous(), Request{Tool: tool.ID(tool.KindMCP, "cnt", name), ByID: true, Input: json.RawMessage(`{}`)})
		return err
	}
	if err := call("wipe"); err != nil {
		t.Fatalf("wipe, fs.delete acknowledged: %v", err)
	}
	te := denied(t, call("pay"), tool.CodeAccessDenied, GateSideEffects)
	if te.Required != "payments" {
		t.Errorf("pay: required %q, want payments", te.Required)
	}
	denied(t, call("env"), tool.CodeAccessDenied, GateSideEffects)
	if n := src.calls.Load(); n != 1 {
		t.Errorf("%d calls ran, want 1", n)
	}
	p, err := r.Plan(context.Background(), r.Anonymous(), Request{Tool: "mcp:cnt:pay", ByID: true, Input: json.RawMessage(`{}`)})
	if err != nil || p.Allowed || p.Denial == nil || p.Denial.Gate != GateSideEffects || p.Denial.Required != "payments" ||
		len(p.Risk.SideEffectPolicies) != 2 || !p.Risk.SideEffectPolicies[0].Acknowledged {
		t.Fatalf("plan pay: %+v %v", p, err)
	}
}
