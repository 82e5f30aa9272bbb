//go:build linux && !amd64 && !arm64

package trampoline

import "golang.org/x/sys/unix"

// On the other architectures, from x/sys/unix: there its package init
// comes before the trampoline's, which is slower but the same.
const (
	sysSeccomp = unix.SYS_SECCOMP
	oPath      = unix.O_PATH
)
