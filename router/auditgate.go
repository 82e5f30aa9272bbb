package router

import (
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// GateAudit refuses calls while the audit log cannot record them.
const GateAudit = audit.GateAudit

// errAudit is the refusal at GateAudit. Why the log cannot record (paths,
// errno) is for the operator's log, which serve writes once per change,
// not for the caller.
var errAudit = &tool.Error{Code: tool.CodeBackendUnavailable, Gate: GateAudit,
	Message: "the audit log cannot record calls right now, so this call was not run",
	Hint:    "retry later; the operator must make room for the audit log (see capgate serve's log)"}

// admit asks the audit sink, before anything runs, for the disk space the
// call's records will take: no call runs without its record. A sink that
// cannot admit (not an audit.Admitter) is trusted, and the zero Ticket
// sends the records to it directly.
func (r *Router) admit() (audit.Ticket, error) {
	if r.admitter == nil {
		return audit.Ticket{}, nil
	}
	t, err := r.admitter.Admit()
	if err != nil {
		return t, errAudit
	}
	return t, nil
}

// record logs e in the space t holds, or, without a ticket, directly.
func (r *Router) record(t *audit.Ticket, e audit.Event) { r.recordPtr(t, &e) }

// recordPtr is record without copying e (some 500 bytes) on the way to
// the ticket: the call path's records go this way.
func (r *Router) recordPtr(t *audit.Ticket, e *audit.Event) {
	if t != nil && t.Active() {
		t.Log(e)
		return
	}
	r.opts.Audit.Log(*e)
}

// auditGate refuses the call when the audit sink, having admitted it,
// turned unhealthy meanwhile (a failed fsync): its record might not be
// made durable. A sink that cannot tell (audit.Health not implemented) is
// trusted.
func (r *Router) auditGate() error {
	if r.health != nil && r.health.Healthy() != nil {
		return errAudit
	}
	return nil
}
