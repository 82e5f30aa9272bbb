//go:build !linux

package sandbox

import (
	"errors"
	"runtime"
	"time"
)

// WatchFileDenials: off Linux there is no Landlock to report denials.
func WatchFileDenials(bool) error {
	return errors.New("no Landlock on " + runtime.GOOS)
}

// SettleAudit: off Linux there are no records to wait for.
func SettleAudit(time.Duration) bool { return false }
