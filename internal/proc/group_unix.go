//go:build unix

package proc

import (
	"os"
	"os/exec"
	"syscall"
)

// NewGroup makes cmd start in its own process group, so that KillGroup
// ends what it started too.
func NewGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// KillGroup SIGKILLs the process group of p, started with NewGroup.
func KillGroup(p *os.Process) error { return syscall.Kill(-p.Pid, syscall.SIGKILL) }
