package mcpconv

import (
	"testing"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// TestAnnotationsMerge: each hint is the more cautious of the upstream's
// and capgate's; a missing hint is the spec's default unless the tool's
// side effects were declared (by the operator or the source).
func TestAnnotationsMerge(t *testing.T) {
	yes, no := true, false
	low := func(from risk.Provenance, e ...risk.SideEffect) risk.Assessment {
		return risk.Assessment{Level: risk.Low, LevelFrom: risk.FromOperator, Effects: e, EffectsFrom: from}
	}
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	for _, tc := range []struct {
		name string
		a    tool.Annotations
		risk risk.Assessment
		want hints
	}{
		{"upstream writes, operator LOW", tool.Annotations{ReadOnlyHint: &no, DestructiveHint: &yes}, low(risk.FromInference), hints{false, true, false, true}},
		{"no hints, operator LOW", tool.Annotations{}, low(risk.FromInference), hints{false, true, false, true}},
		{"no hints, operator declares no effects", tool.Annotations{}, low(risk.FromOperator), hints{true, false, true, false}},
		{"no hints, pack declares fs.write", tool.Annotations{}, low(risk.FromSource, risk.FSWrite), hints{false, false, false, false}},
		{"read-only upstream, no destructive hint", tool.Annotations{ReadOnlyHint: &yes, OpenWorldHint: &no, IdempotentHint: &yes}, low(risk.FromInference), hints{true, false, true, false}},
		{"read-only and destructive upstream", tool.Annotations{ReadOnlyHint: &yes, DestructiveHint: &yes}, low(risk.FromInference), hints{false, true, false, true}},
		{"read-only upstream, operator says it deletes", tool.Annotations{ReadOnlyHint: &yes, DestructiveHint: &no, OpenWorldHint: &no}, low(risk.FromOperator, risk.FSDelete), hints{false, true, false, false}},
		{"closed upstream, capgate sees network", tool.Annotations{ReadOnlyHint: &yes, DestructiveHint: &no, OpenWorldHint: &no}, low(risk.FromOperator, risk.NetworkHTTP), hints{true, false, true, true}},
	} {
		a := Annotations(&tool.Descriptor{Annotations: tc.a, Risk: tc.risk})
		got := hints{*a.ReadOnlyHint, *a.DestructiveHint, *a.IdempotentHint, *a.OpenWorldHint}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
