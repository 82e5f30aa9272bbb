//go:build !unix

package proc

import (
	"os"
	"os/exec"
)

// NewGroup does nothing off Unix: there are no process groups to kill
// whole (a Windows job object would be the equivalent; not done yet).
func NewGroup(*exec.Cmd) {}

// KillGroup kills p alone: off Unix, what p started itself may outlive it.
func KillGroup(p *os.Process) error { return p.Kill() }
