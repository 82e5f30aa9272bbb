package pgtest

import "syscall"

// dieWithParent: a test binary that crashes takes its PostgreSQL with it.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
