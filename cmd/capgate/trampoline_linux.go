package main

import "github.com/capgate/capgate/sandbox"

// trampoline turns this process into the sandbox launcher's trampoline
// when capgate started it as one (it then never returns): every tool
// capgate starts confined is capgate re-executing itself first.
func trampoline() { sandbox.Main() }
