//go:build !unix

package testkit

import "time"

// CPUTime is not measured without getrusage: a benchmark's cpu-ns/op
// reads 0 there.
func CPUTime() time.Duration { return 0 }
