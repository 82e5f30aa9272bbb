package trampoline

// Numbers package syscall lacks on arm64 (see sys_linux_amd64.go).
const (
	sysSeccomp = 277
	oPath      = 0x200000
)
