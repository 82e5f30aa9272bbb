// Package trampoline is the process every tool capgate starts confined
// runs as first: capgate re-executed (under internal/nsinit, where the
// tool gets a PID namespace), which confines itself as the launcher's
// Plan says (capabilities, Landlock, no_new_privs, the user, seccomp) and
// execs the tool. It works at this package's init, which imports no
// capgate package but nsinit, so that little of capgate initialises first.
// The launcher, which decides the Plan, is package sandbox.
package trampoline
