// Package trampoline is the process every tool capgate starts confined
// runs as first: capgate re-executed (under internal/nsinit, where the
// tool gets a PID namespace), which confines itself as the launcher's
// Plan says (capabilities, Landlock, no_new_privs, the user, seccomp) and
// execs the tool. With cgo (how capgate is built) it is a C constructor
// (trampoline_cgo.go) that runs before the Go runtime starts, so Go never
// starts between capgate and the tool; without cgo it works at this
// package's init (trampoline_linux.go), which imports no capgate package
// but nsinit and only early standard packages, so that little of capgate
// initialises first. Either way each confinement binds the thread that
// execs the tool, which execve keeps (see restrict). The launcher, which
// decides the Plan, builds the Landlock ruleset and the seccomp filter,
// is package sandbox.
package trampoline
