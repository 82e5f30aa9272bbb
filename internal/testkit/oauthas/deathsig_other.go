//go:build !linux

package oauthas

import "syscall"

func dieWithParent(*syscall.SysProcAttr) {}
