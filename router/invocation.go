package router

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/capgate/capgate/audit"
)

// ModePlanning is the mode of a planning call: capability.invoke's mode
// param, or _meta["capgate/mode"] on an MCP tools/call.
const ModePlanning = "planning"

// ModeExecution is AgentOS's name for an ordinary call: the same as no mode.
const ModeExecution = "execution"

// maxClientInvocationID bounds a caller's invocation_id, which every
// record of the call carries.
const maxClientInvocationID = 128

// CheckClientInvocationID refuses a caller's invocation_id that is too
// long or holds control characters; "" (none given) is fine.
func CheckClientInvocationID(id string) error {
	if len(id) > maxClientInvocationID {
		return fmt.Errorf("is %d bytes; at most %d", len(id), maxClientInvocationID)
	}
	if !utf8.ValidString(id) || strings.ContainsFunc(id, unicode.IsControl) {
		return errors.New("holds a control character or invalid UTF-8")
	}
	return nil
}

// DurationMS is the call's duration in milliseconds, to the microsecond,
// as both front doors report it.
func (inv Invocation) DurationMS() float64 {
	return float64(inv.Duration.Microseconds()) / 1000
}

// SideEffectNames are the declared side effects as strings, never null.
func (inv Invocation) SideEffectNames() []string {
	out := make([]string, len(inv.SideEffects))
	for i, e := range inv.SideEffects {
		out[i] = string(e)
	}
	return out
}

// startRecord writes a call's invocation_start record at admission, before
// any gate (AgentOS lists it): who asked for what, under which ids.
func (r *Router) startRecord(tk *audit.Ticket, ev *audit.Event, at time.Time) {
	start := *ev
	start.Type, start.Time = audit.TypeInvocationStart, at
	r.recordPtr(tk, &start)
}
