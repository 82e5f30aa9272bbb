//go:build unix

package testkit

import (
	"os/exec"
	"syscall"
)

// runAs makes cmd run as u.
func runAs(cmd *exec.Cmd, u *User) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.Uid), Gid: uint32(u.Gid)}
}
