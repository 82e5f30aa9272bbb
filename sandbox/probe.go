//go:build linux

package sandbox

import (
	"os"
	"strconv"
	"strings"

	seccomp "github.com/elastic/go-seccomp-bpf"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Features is what this kernel, for this process, can enforce with.
type Features struct {
	LandlockABI int  // 0: no Landlock
	Seccomp     bool // seccomp filters can be loaded
	UserNS      bool // an unprivileged process may create a user namespace
	NetNS       bool // this process may start a child in a new network namespace
	PidNS       bool // this process may start a child in a new PID namespace
	Privileged  bool // this process has CAP_SYS_ADMIN, so needs no user namespace
}

// Probe asks the kernel what it supports. It changes nothing.
func Probe() Features {
	var f Features
	if v, err := llsys.LandlockGetABIVersion(); err == nil {
		f.LandlockABI = v
	}
	f.Seccomp = seccomp.Supported()
	f.Privileged = hasSysAdmin()
	f.UserNS = exists("/proc/self/ns/user") && sysctlAtLeast("/proc/sys/user/max_user_namespaces", 1, false) &&
		sysctlAtLeast("/proc/sys/kernel/unprivileged_userns_clone", 1, true) &&
		!sysctlAtLeast("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", 1, false)
	f.NetNS = exists("/proc/self/ns/net") && (f.Privileged || f.UserNS)
	f.PidNS = exists("/proc/self/ns/pid") && (f.Privileged || f.UserNS)
	return f
}

// Check reports every guarantee of g that the launcher could not have the
// kernel enforce here. An empty result means all of g is enforced.
func (f Features) Check(g Guarantees) []Missing {
	var out []Missing
	for _, k := range Keys {
		if !g.Has(k) {
			continue
		}
		if feat := f.missingFor(k); feat != "" {
			out = append(out, Missing{Key: k, Feature: feat})
		}
	}
	return out
}

func (f Features) missingFor(k Key) string {
	switch k {
	case NoFilesystemRead, NoFilesystemWrite:
		if f.LandlockABI < 1 {
			return "Landlock"
		}
	case NoNetwork:
		// A network namespace, or else Landlock TCP rules (ABI 4) plus a
		// seccomp filter on socket() for the other families.
		if !f.NetNS && (f.LandlockABI < 4 || !f.Seccomp) {
			return "network namespaces, or Landlock ABI >= 4 with seccomp"
		}
	case NoSubprocess:
		if !f.Seccomp {
			return "seccomp"
		}
	case NoEnvRead, NoEnvWrite:
		// The environment is built by the launcher; a child can never write
		// its parent's. Reading capgate's own /proc/<pid>/environ is a
		// ptrace-mode access that Landlock refuses across domains.
		if k == NoEnvRead && f.LandlockABI < 1 {
			return "Landlock"
		}
	}
	return ""
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// sysctlAtLeast reads an integer sysctl; absent, it answers ifAbsent.
func sysctlAtLeast(path string, min int, ifAbsent bool) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return ifAbsent
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && n >= min
}

func hasSysAdmin() bool {
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0
}

// BaselineMissing says what this kernel lacks for the baseline every tool
// gets (capgate's own files out of reach): "" when it has it all.
func BaselineMissing() string {
	if probed().LandlockABI < 1 {
		return "Landlock: tools that declare nothing can read and write capgate's data dir, config and keys where file modes allow"
	}
	return ""
}
