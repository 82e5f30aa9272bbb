package sandbox

import (
	"fmt"
	"strings"

	"github.com/capgate/capgate/internal/nsinit"
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

// StartFailed reports whether a process that exited with status and wrote
// stderr was refused by the launcher before its program ran: the
// trampoline exits 126 after saying why, prefixed "capgate sandbox: ".
func StartFailed(status int, stderr string) bool {
	return status == startFailure && strings.HasPrefix(strings.TrimSpace(stderr), failPrefix)
}

// startFailure and failPrefix are how the trampoline ends (fail), and
// the tool's init (internal/nsinit).
const (
	startFailure = nsinit.StartFailure
	failPrefix   = nsinit.FailPrefix
)
