package router

import (
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// TypeSkillRun is the audit type of one use_skill run; its inner tool
// calls are audited as tool calls of their own.
const TypeSkillRun = "skill_run"

// SkillRun is one skill run admitted to the audit log: it runs only if
// its record can be made, and End logs it.
type SkillRun struct {
	r     *Router
	tk    audit.Ticket
	ev    audit.Event
	start time.Time
}

// BeginSkill admits a run of skill name by c. Like a tool call waiting on
// its tool, the run keeps room for its one record only.
func (r *Router) BeginSkill(c *Caller, name, protocol string) (*SkillRun, error) {
	tk, err := r.admit()
	if err != nil {
		return nil, err
	}
	if err := r.auditGate(); err != nil {
		tk.Done()
		return nil, err
	}
	tk.Keep(1)
	now := r.opts.Now()
	ev := audit.Event{Type: TypeSkillRun, Tool: "skill:" + name, ToolName: name, Protocol: protocol, Time: now}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	return &SkillRun{r: r, tk: tk, ev: ev, start: now}, nil
}

// BeganAt says the run began at t, before BeginSkill: on another replica,
// which handed it on. Its duration counts from then.
func (s *SkillRun) BeganAt(t time.Time) {
	if !t.IsZero() && t.Before(s.start) {
		s.start = t
	}
}

// HandedOn ends the run here without a record: it went on on another
// replica, which records it when it ends.
func (s *SkillRun) HandedOn() { s.tk.Done() }

// End logs the run: its iterations (sampling requests), inner tool calls
// and outcome (done, partial at the iteration limit, or an error's code).
func (s *SkillRun) End(iterations, toolCalls int, partial bool, err error) {
	ev := s.ev
	ev.Time = s.r.opts.Now()
	ev.Duration = ev.Time.Sub(s.start)
	outcome := "done"
	switch {
	case err != nil:
		ev.Decision, ev.Code, outcome = "error", string(tool.ErrorCode(err)), "error"
	case partial:
		ev.Decision, outcome = "allow", "partial"
	default:
		ev.Decision = "allow"
	}
	ev.Detail = fmt.Sprintf("iterations=%d tool_calls=%d outcome=%s", iterations, toolCalls, outcome)
	s.r.record(&s.tk, ev)
	s.tk.Done()
}

// Deny logs the run as refused before its first sampling request, with
// the gate and capability string that refused it.
func (s *SkillRun) Deny(err error) {
	ev := s.ev
	ev.Decision, ev.Code = "deny", string(tool.ErrorCode(err))
	var te *tool.Error
	if errors.As(err, &te) {
		ev.Gate, ev.Required = te.Gate, te.Required
	}
	ev.Detail = "iterations=0 tool_calls=0 outcome=refused"
	s.r.record(&s.tk, ev)
	s.tk.Done()
}
