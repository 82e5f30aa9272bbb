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

// resolved fills in what a record says of the tool a call resolved to.
func resolved(ev *audit.Event, d *tool.Descriptor) {
	ev.Tool, ev.Kind, ev.ResolvedSource, ev.Runner = d.ID, string(d.Kind), d.Source, runner(d)
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
func (r *Router) kernelDenied(tk *audit.Ticket, ev *audit.Event, d *tool.Descriptor) func(string) {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(key string) {
		mu.Lock()
		defer mu.Unlock()
		if seen[key] {
			return
		}
		seen[key] = true
		from := ""
		if g, ok := d.Guarantees.Get(key); ok {
			from = g.Source
		}
		what := map[string]string{string(sandbox.NoNetwork): "a socket", string(sandbox.NoSubprocess): "a new process"}[key]
		check := audit.Event{Type: audit.TypeCapabilityCheck, ToolName: d.ExposedName, Capability: sandbox.Key(key).Capability(),
			GuaranteeSource: from, Reason: "guarantee_blocked", ProtocolVersion: 1,
			Sub: ev.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType, Protocol: ev.Protocol,
			Decision: "deny", Gate: GateGuarantee, RequestID: ev.RequestID, Guarantees: ev.Guarantees,
			Detail: "the kernel refused the tool " + what + " (" + key + "); the call went on"}
		resolved(&check, d)
		r.record(tk, check)
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
	first := u.Missing[0].Key
	from := string(sandbox.FromTrust) // the deny paths are the operator's
	if g, ok := d.Guarantees.Get(string(first)); ok {
		from = g.Source
	}
	needs := make([]string, len(u.Missing))
	for i, m := range u.Missing {
		needs[i] = string(m.Key) + " needs " + m.Feature
	}
	check := audit.Event{Type: audit.TypeCapabilityCheck, ToolName: d.ExposedName, Capability: first.Capability(),
		GuaranteeSource: from, Reason: "guarantee_blocked", ProtocolVersion: 1,
		Sub: ev.Sub, ChatID: ev.ChatID, ChatType: ev.ChatType, Protocol: ev.Protocol,
		Decision: "deny", Gate: GateGuarantee, Code: string(tool.CodeBackendUnavailable), RequestID: ev.RequestID,
		Guarantees: ev.Guarantees, Detail: "not enforceable on this kernel: " + strings.Join(needs, "; ")}
	resolved(&check, d)
	r.record(tk, check)
}
