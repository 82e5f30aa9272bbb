//go:build !linux

package sandbox

import (
	"errors"
	"runtime"
)

// WatchFileDenials: off Linux there is no Landlock to report denials.
func WatchFileDenials(bool) error {
	return errors.New("no Landlock on " + runtime.GOOS)
}
