//go:build !linux

package sandbox

import (
	"os"
	"time"
)

// stamp is never valid here: each start hashes its files again (tools
// run without the Linux launcher's confinement on these platforms).
type stamp struct {
	valid   bool
	changed time.Time
}

func stampOf(path string) (stamp, bool) {
	fi, err := os.Stat(path)
	return stamp{}, path != "" && err == nil && fi.Mode().IsRegular()
}
