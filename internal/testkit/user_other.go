//go:build !unix

package testkit

import "os/exec"

// runAs is a no-op off Unix: there is no user to switch to.
func runAs(*exec.Cmd, *User) {}
