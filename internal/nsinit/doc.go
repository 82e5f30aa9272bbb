// Package nsinit is the first process (init, PID 1) of a tool's own PID
// namespace: capgate re-executed with Env set. It starts the sandbox's
// trampoline (capgate once more, which confines itself and execs the
// tool), reaps every process the namespace orphans, and exits as the
// trampoline did. When it dies, however (capgate died and the kernel's
// parent-death signal killed it, capgate's timeout killed it, the tool
// ended), the kernel kills every process left in the namespace: the
// tool's children too, even those that left its process group or session.
//
// With cgo (how capgate is normally built), that work is a C constructor
// (init_cgo.go) that runs before the Go runtime starts: init never starts
// Go, and the trampoline is its fork, which goes on to the trampoline's
// own C constructor (sandbox/trampoline, which runs after this one) and
// execs the tool, so Go never starts between capgate and the tool. That took the namespace's added CPU per tool start from about 35
// ms to almost nothing (BenchmarkLaunchPidNS, sandbox). Without cgo, this package's Go init
// does the same: it needs a few standard packages only (not even
// strings), so it runs after about 25 of capgate's package inits.
//
// The namespace has a mount namespace of its own too, where init mounts a
// /proc of the new PID namespace: the host's /proc names the tool's
// processes by other PIDs, or not at all (go-landlock's all-thread
// syscalls, which the trampoline no longer makes, failed on that). The
// tool sees only its own processes.
//
// The trampoline is not init itself: the tool it execs would then be PID
// 1, which ignores SIGTERM and SIGPIPE by default and must reap every
// orphan, which a long-running MCP server does not.
package nsinit

// Env carries init's settings from the launcher: "ALIVE,NOTIFY", the fd of
// capgate's pidfd (-1: none) and 1 when fd 4 is the seccomp notifier's.
const Env = "CAPGATE_SANDBOX_INIT"

// StartFailure and FailPrefix are how init and the trampoline end when
// they cannot start the tool: this status, and stderr starting so.
const (
	StartFailure = 126
	FailPrefix   = "capgate sandbox: "
)
