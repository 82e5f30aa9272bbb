// Command gotrampoline is package trampoline alone: built without cgo
// (CGO_ENABLED=0), it is the trampoline's Go implementation, which the
// sandbox's tests run as Spec.Trampoline beside the C one every cgo build
// of capgate runs.
package main

import _ "github.com/capgate/capgate/sandbox/trampoline"

func main() {}
