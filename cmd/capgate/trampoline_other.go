//go:build !linux

package main

// trampoline: the launcher is Linux only; elsewhere there is none.
func trampoline() {}
