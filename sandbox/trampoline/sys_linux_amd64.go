package trampoline

// Numbers package syscall lacks on amd64 (golang.org/x/sys/unix has them,
// but its package init would hold the trampoline's back, see doc.go).
const (
	sysSeccomp = 317
	oPath      = 0x200000
)
