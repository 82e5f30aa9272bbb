package audit

import "fmt"

// Health is a Sink that can tell whether it can make records durable right
// now. The router asks it before it runs a tool, and refuses the call when
// it cannot: no call runs without its record.
type Health interface {
	// Healthy returns nil, or why records cannot be made durable now.
	Healthy() error
}

var _ Health = (*Log)(nil)

// GateAudit is the gate that refuses calls while the audit log is
// unhealthy. A Log does not queue such refusals while it is unhealthy: the
// disk has no room for them, and they would crowd out the records of calls
// that did run. It counts them instead (Unrecorded).
const GateAudit = "audit"

// defaultReserve is how far ahead of its last line a Log keeps disk space
// allocated: records of calls already let through land there even when
// the disk fills meanwhile, and a full disk shows up at the next group
// commit as a failed reservation, before calls are let through.
const defaultReserve = 4 << 20

// Healthy reports nil, or why records cannot be made durable now: the
// disk space ahead of the log cannot be reserved, or a write, fsync or
// sidecar update failed. It is cheap (one atomic load), and clears by
// itself once the writer succeeds again; the writer retries every
// FlushInterval while it is set.
func (l *Log) Healthy() error {
	if p := l.sick.Load(); p != nil {
		return *p
	}
	return nil
}

// Unrecorded counts events not written because the log was unhealthy:
// refusals at GateAudit, and events no Ticket covered for which no
// reserved space was left (see admit.go).
func (l *Log) Unrecorded() uint64 { return l.unrecorded.Load() }

// setHealth records the outcome of a round of I/O, calling OnHealth when
// the log turns unhealthy or recovers. Call with iomu held.
func (l *Log) setHealth(err error) {
	old := l.sick.Load()
	if err == nil {
		if old != nil {
			l.sick.Store(nil)
			if l.onHealth != nil {
				l.onHealth(nil)
			}
		}
		return
	}
	l.sick.Store(&err)
	if old == nil {
		l.wake() // those waiting for reserved space are refused now
		if l.onHealth != nil {
			l.onHealth(err)
		}
	}
}

// reserveAhead keeps disk space allocated for the next reserve bytes
// after the file's end, without changing its size (FALLOC_FL_KEEP_SIZE),
// so that a full disk is an error here rather than in the middle of a
// write. *end is where the space reserved in f ends; only what lies
// between it and size+reserve is asked for, because a failed fallocate
// may undo the whole range it was given (tmpfs does), and the space
// already reserved must stay for the records already promised. A
// filesystem without fallocate (and every OS but Linux) is left to the
// write errors. Call with iomu held.
func (l *Log) reserveAhead(f fdFile, size int64, end *int64) error {
	if l.reserve <= 0 || l.noFalloc {
		return nil
	}
	from, to := max(*end, size), size+l.reserve
	if from >= to {
		return nil
	}
	err := fallocate(f, from, to-from)
	if cannotReserve(err) {
		// Nothing can be reserved: health alone admits calls.
		l.noFalloc = true
		l.budget.Store(unlimited)
		l.wake()
		return nil
	}
	if err != nil {
		return fmt.Errorf("audit: %s: reserving %d bytes ahead of the log: %w", l.path, l.reserve, err)
	}
	*end = to
	return nil
}

type fdFile interface{ Fd() uintptr }
