package sandbox

import (
	"fmt"
	"strings"
)

// Missing is one guarantee this kernel cannot enforce, and why.
type Missing struct {
	Key     Key
	Feature string // the missing kernel feature, e.g. "Landlock (ABI >= 1)"
}

// UnenforceableError is the launcher's refusal to start a tool whose
// guarantees this kernel cannot prove. The router reports it as
// capability_backend_unavailable, naming the features.
type UnenforceableError struct{ Missing []Missing }

func (e *UnenforceableError) Error() string {
	parts := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		parts[i] = fmt.Sprintf("%s needs %s", m.Key, m.Feature)
	}
	return "sandbox: guarantees not enforceable on this kernel: " + strings.Join(parts, "; ")
}
