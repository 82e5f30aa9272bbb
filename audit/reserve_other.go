//go:build !linux || capgate_noreserve

package audit

import (
	"errors"
	"runtime"
)

// Only Linux has fallocate(FALLOC_FL_KEEP_SIZE). Elsewhere a Log holds no
// reserve: it runs as on a Linux filesystem without fallocate, where
// health alone admits calls and a full disk surfaces as a write error at
// the next group commit (records of calls already let through then wait
// in memory for space, and are lost if capgate stops first). Writing zeros instead would grow the file and break the log's
// format, so nothing is pretended. The tag capgate_noreserve builds this
// on Linux too, so that its tests run there (see .ci/run).
var errNoFallocate = errors.New("no fallocate on " + runtime.GOOS)

func fallocate(fdFile, int64, int64) error { return errNoFallocate }

func cannotReserve(err error) bool { return errors.Is(err, errNoFallocate) }

func release(fdFile, int64, int64) {}
