package router

import (
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/tool"
)

// May reports whether the caller may do p on item id of type t (a prompt
// or skill is a directive, a resource is knowledge). As for tools,
// execute implies fetch. Use it to filter lists; Fetch to gate a read.
func (r *Router) May(c *Caller, p permissions.Primary, t permissions.ItemType, id string) bool {
	if c == nil {
		return false
	}
	if c.grants.Allows(permissions.Required(p, t, id)) {
		return true
	}
	return p == permissions.Fetch && c.grants.Allows(permissions.Required(permissions.Execute, t, id))
}

// Fetch gates reading item id of type t (a prompt, a resource) and audits
// the decision. A refusal reads exactly like a missing item, so that what
// a caller may not see is not revealed; what names the item in it.
func (r *Router) Fetch(c *Caller, t permissions.ItemType, id, what, protocol string) error {
	// The read runs only if its record can be made.
	tk, err := r.admit()
	if err != nil {
		return err
	}
	defer tk.Done()
	required := permissions.Required(permissions.Fetch, t, id)
	allowed := r.May(c, permissions.Fetch, t, id)
	ev := audit.Event{Type: audit.TypeGrantCheck, Required: required,
		Protocol: protocol, Tool: id, Gate: GateCapability, Time: r.opts.Now()}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	if allowed {
		ev.Decision = "allow"
		r.record(&tk, ev)
		return nil
	}
	ev.Decision, ev.Code = "deny", string(tool.CodeNotFound)
	r.record(&tk, ev)
	return tool.Errorf(tool.CodeNotFound, "no such %s", what)
}
