//go:build linux

// Command nolandlock runs a program (argv[1:]) on a kernel that, for it
// and its children, has no Landlock: a seccomp filter answers ENOSYS to the
// landlock syscalls, as the default profiles of older container runtimes
// do. The sandbox tests start capgate serve through it to see what capgate
// does with guarantees this kernel cannot prove.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nolandlock PROGRAM [ARG...]")
		os.Exit(2)
	}
	f := seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{{
			Action: seccomp.Action(uint32(seccomp.ActionErrno) | uint32(unix.ENOSYS)),
			Names:  []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"},
		}},
	}}
	if err := seccomp.LoadFilter(f); err != nil {
		fmt.Fprintln(os.Stderr, "nolandlock:", err)
		os.Exit(1)
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "nolandlock:", err)
		os.Exit(1)
	}
	err = syscall.Exec(path, os.Args[1:], os.Environ())
	fmt.Fprintln(os.Stderr, "nolandlock:", err)
	os.Exit(1)
}
