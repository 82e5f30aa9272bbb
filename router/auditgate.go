package router

import (
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// GateAudit refuses calls while the audit log cannot record them.
const GateAudit = audit.GateAudit

// auditGate refuses the call when the audit sink says it cannot make
// records durable now: no tool runs without its record. A sink that cannot
// tell (audit.Health not implemented) is trusted. Why the sink is unhealthy
// (paths, errno) is for the operator's log, not the caller.
func (r *Router) auditGate() error {
	h, ok := r.opts.Audit.(audit.Health)
	if !ok || h.Healthy() == nil {
		return nil
	}
	return &tool.Error{Code: tool.CodeBackendUnavailable, Gate: GateAudit,
		Message: "the audit log cannot record calls right now, so this call was not run",
		Hint:    "retry later; the operator must make room for the audit log (see capgate serve's log)"}
}
