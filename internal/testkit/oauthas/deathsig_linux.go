package oauthas

import "syscall"

// dieWithParent: a test binary that crashes takes its shared server with it.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
