//go:build !unix

package audit

import "time"

// cpuTime is not measured without getrusage: BenchmarkLog's cpu-ns/op
// reads 0 there.
func cpuTime() time.Duration { return 0 }
