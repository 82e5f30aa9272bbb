//go:build unix

package proc

import (
	"os"
	"os/exec"
	"syscall"
)

// NewGroup makes cmd start in its own process group, so that KillGroup
// ends what it started too. It keeps the rest of cmd's attributes (the
// launcher's namespaces).
func NewGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// KillGroup SIGKILLs the process group of p, started with NewGroup.
func KillGroup(p *os.Process) error { return syscall.Kill(-p.Pid, syscall.SIGKILL) }
