package router

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// GateGuarantee is where a tool whose guarantees this kernel cannot
// prove is refused: at its launch, before it runs.
const GateGuarantee = "guarantee"

// resolved fills in what a record says of the tool a call resolved to:
// resolved_source in the trace's words (installed_pack, binding); the
// source's own name is in the tool id.
func resolved(ev *audit.Event, d *tool.Descriptor) {
	ev.Tool, ev.Kind, ev.ResolvedSource, ev.Runner = d.ID, string(d.Kind), tool.ResolvedSource(d.Kind), runner(d)
}

// runner is the trace's word for where d runs: local for a process capgate
// starts, service for one it only talks to.
func runner(d *tool.Descriptor) string {
	if d.Guarantees != nil {
		return d.Guarantees.Runner
	}
	return tool.RunnerService
}

// guaranteesJSON is a confined tool's guarantees as its records carry
// them; "" for a tool that guarantees nothing.
func guaranteesJSON(d *tool.Descriptor) string {
	if d.Guarantees == nil || len(d.Guarantees.Keys) == 0 {
		return ""
	}
	b, err := json.Marshal(d.Guarantees)
	if err != nil {
		return ""
	}
	return string(b)
}

// kernelDenied is a call's tool.Call.Denied: the first time the kernel
// refuses the tool something a guarantee withholds, a capability_check
// record says so. The call goes on; the tool got EPERM.
func (r *Router) kernelDenied(tk *audit.Ticket, ev audit.Event, d *tool.Descriptor) func(string) {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(key string) {
		mu.Lock()
		defer mu.Unlock()
		if seen[key] {
			return
		}
		seen[key] = true
		what := map[string]string{string(sandbox.NoNetwork): "a socket", string(sandbox.NoSubprocess): "a new process"}[key]
		r.record(tk, guaranteeCheck(&ev, d, sandbox.Key(key), "", "",
			"the kernel refused the tool "+what+" ("+key+"); the call went on"))
		r.opts.Metrics.SandboxDenied(string(d.Kind) + ":" + d.Source)
	}
}

// guaranteeBlocked records, as a capability_check in the trace's schema,
// a call refused because the kernel cannot prove one of its tool's
// guarantees: the first one unprovable is the capability, all of them are
// in the detail.
func (r *Router) guaranteeBlocked(tk *audit.Ticket, ev *audit.Event, d *tool.Descriptor, err error) {
	var u *sandbox.UnenforceableError
	if !errors.As(err, &u) || len(u.Missing) == 0 {
		return
	}
	needs := make([]string, len(u.Missing))
	for i, m := range u.Missing {
		needs[i] = string(m.Key) + " needs " + m.Feature
	}
	// A deny path without a source of its own is the operator's.
	r.record(tk, guaranteeCheck(ev, d, u.Missing[0].Key, string(sandbox.FromTrust), tool.CodeBackendUnavailable,
		"not enforceable on this kernel: "+strings.Join(needs, "; ")))
}

// guaranteeCheck is the capability_check record, in the trace's schema,
// of the call ev refused or held back at key, one of d's guarantees: its
// source is the guarantee's, else from.
func guaranteeCheck(ev *audit.Event, d *tool.Descriptor, key sandbox.Key, from string, code tool.Code, detail string) audit.Event {
	if g, ok := d.Guarantees.Get(string(key)); ok {
		from = g.Source
	}
	check := audit.Event{Type: audit.TypeCapabilityCheck, ToolName: d.ExposedName, Capability: key.Capability(),
		GuaranteeSource: from, Reason: "guarantee_blocked", ProtocolVersion: 1,
		Sub: ev.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType, Protocol: ev.Protocol,
		Decision: "deny", Gate: GateGuarantee, Code: string(code), RequestID: ev.RequestID,
		Guarantees: ev.Guarantees, Detail: detail}
	resolved(&check, d)
	return check
}
