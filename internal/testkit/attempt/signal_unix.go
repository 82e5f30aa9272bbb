//go:build unix

package attempt

import "syscall"

// signal0 checks whether this process may signal pid (kill with no signal).
func signal0(pid int) error { return syscall.Kill(pid, 0) }
