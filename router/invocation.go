package router

// ModePlanning is the mode of a planning call: capability.invoke's mode
// param, or _meta["capgate/mode"] on an MCP tools/call.
const ModePlanning = "planning"

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
