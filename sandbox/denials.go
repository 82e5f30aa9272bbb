package sandbox

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Denials collects the guarantees the kernel refused one call's process
// (a socket under no_network, a process under no_subprocess), so that the
// call's error can name them and what would allow them.
type Denials struct {
	mu   sync.Mutex
	keys []Key
}

// Observe is an observer for Confinement.ObservedBy that records each
// refusal and passes it on to next (the router's record), when set.
func (d *Denials) Observe(next func(string)) func(string) {
	return func(k string) {
		d.mu.Lock()
		if !slices.Contains(d.keys, Key(k)) {
			d.keys = append(d.keys, Key(k))
		}
		d.mu.Unlock()
		if next != nil {
			next(k)
		}
	}
}

// allowWith is the declaration that lifts each observed guarantee.
var allowWith = map[Key]string{NoNetwork: "network: outbound", NoSubprocess: "subprocess: allow"}

// Explain says what the kernel refused (msg, "" when nothing) and what
// would allow it (hint): the declaration in declare (where the tool's
// capabilities are written), the operator's override under overrideKey,
// or [trust], whichever set the guarantee.
func (d *Denials) Explain(g Guarantees, overrideKey, declare string) (msg, hint string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.keys) == 0 {
		return "", ""
	}
	var what, how []string
	for _, k := range d.keys {
		thing := map[Key]string{NoNetwork: "a socket", NoSubprocess: "a new process"}[k]
		what = append(what, fmt.Sprintf("%s (%s, set by %s)", thing, k, g.From[k]))
		switch g.From[k] {
		case FromOverride:
			how = append(how, fmt.Sprintf("remove %s = true from [capability_overrides.%q]", k, overrideKey))
		case FromPack:
			// A command's own declaration cannot loosen its pack's.
			how = append(how, fmt.Sprintf("declare %s in the pack's top-level capabilities in its extension.yaml (they hold for every command of the pack)", allowWith[k]))
		case FromTrust:
			how = append(how, fmt.Sprintf("[trust] allowed_capabilities withholds %s from every tool", k.Capability()))
		default:
			how = append(how, fmt.Sprintf("declare %s in %s", allowWith[k], declare))
		}
	}
	return "the kernel refused it " + strings.Join(what, " and "), strings.Join(how, "; ")
}
