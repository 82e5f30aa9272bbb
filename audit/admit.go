package audit

import (
	"crypto/sha256"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"
)

// Admission by reserved budget: no call runs unless the disk space its
// records will take is already allocated (see Options.Reserve).
//
// The Log keeps budget: the bytes of disk reserved past the file's end,
// minus the bytes promised to records queued but not yet written and to
// calls admitted but not yet done. Admit takes a call's worst case from
// it, Ticket.Done gives back what the call's records did not use, a
// record written gives back its promise as the file's end moves over the
// reserved space it was promised, and only a reservation that succeeded
// (fallocate) adds to it. A disk that fills therefore cannot make an
// admitted call's record fail for lack of space: it was allocated before
// the call ran. Records not covered by a Ticket take their bytes from the
// budget too; while the log is unhealthy and the budget is spent they are
// not queued but counted (Unrecorded), since they could not be written
// and would take the place of records promised to calls that ran.

const (
	// maxRecord bounds a record's bytes, all but seq and prev: longer
	// fields are cut (see bound), so that a call's worst case is known.
	maxRecord = 2 << 10
	// lineOverhead is the most a line adds to its encoded event: seq's
	// digits, prev, the closing `"}` and the newline.
	lineOverhead = 20 + 2*sha256.Size + 3
	// recordCost is the most disk one record takes.
	recordCost = maxRecord + lineOverhead
	// CallRecords is how many records one call's Ticket covers: its
	// invocation_start, grant_check, an approval and its tool_call.
	CallRecords = 4
	// minReserve is the least Reserve: room for a few calls' worst case.
	minReserve = 64 << 10
	// unlimited is the budget of a Log that reserves no space (Reserve
	// negative, or a filesystem without fallocate): health alone admits.
	unlimited = math.MaxInt64 / 4
)

// Admitter is a Sink that admits calls: the router asks it before a call
// runs, and refuses the call when it says no.
type Admitter interface {
	Sink
	// Admit returns a Ticket covering CallRecords records of one call, or
	// why the call must not run. It waits while the log is healthy and
	// its reserved space is promised to records not yet written.
	Admit() (Ticket, error)
}

var _ Admitter = (*Log)(nil)

// ErrClosed is Admit's answer after Close.
var ErrClosed = errors.New("audit: log closed")

// Ticket is one admitted call's share of the reserved disk space. Its
// records are logged through it (Log), and Done gives back the rest. The
// zero Ticket is not active: Log on it drops the event.
type Ticket struct {
	l    *Log
	left int64
}

// Active reports whether t came from a successful Admit.
func (t *Ticket) Active() bool { return t.l != nil }

// Log logs e in the space the ticket holds. It does not keep or change e.
func (t *Ticket) Log(e *Event) {
	if t.l != nil {
		t.l.log(e, t)
	}
}

// Keep gives back all but what n more records need: a call about to run
// its tool keeps room for its tool_call record only, so that calls
// running long hold little of the reserved space.
func (t *Ticket) Keep(n int) {
	if keep := int64(n) * recordCost; t.l != nil && t.left > keep {
		t.l.give(t.left - keep)
		t.left = keep
	}
}

// Done gives back what the ticket still holds. Call it once the call's
// last record is logged.
func (t *Ticket) Done() {
	if t.l != nil && t.left > 0 {
		t.l.give(t.left)
		t.left = 0
	}
}

// Admit takes a call's worst case (CallRecords records) from the budget.
// While the log is healthy and the budget is spent it waits: the space
// comes back as the queued records are written, or the next reservation
// fails and the log turns unhealthy. An unhealthy log refuses at once,
// with why.
func (l *Log) Admit() (Ticket, error) {
	const cost = CallRecords * recordCost
	for {
		if p := l.sick.Load(); p != nil {
			return Ticket{}, *p
		}
		if l.budget.Add(-cost) >= 0 {
			return Ticket{l: l, left: cost}, nil
		}
		l.give(cost)
		if !l.waitBudget(cost) {
			if p := l.sick.Load(); p != nil {
				return Ticket{}, *p
			}
			return Ticket{}, ErrClosed
		}
	}
}

// take takes n bytes from the budget for a record no Ticket covers,
// waiting like Admit. It reports false when the record cannot be queued.
func (l *Log) take(n int64) bool {
	for {
		if l.budget.Add(-n) >= 0 {
			return true
		}
		l.give(n)
		if !l.waitBudget(n) {
			return false
		}
	}
}

// give returns n bytes to the budget, waking whoever waits for it.
func (l *Log) give(n int64) {
	l.budget.Add(n)
	if l.waiters.Load() > 0 {
		l.wake()
	}
}

func (l *Log) wake() {
	l.mu.Lock()
	l.cond.Broadcast()
	l.mu.Unlock()
}

// waitBudget waits until the budget holds n bytes; it reports false at
// once when the log is unhealthy or closed. The writer is told to write
// now: the space comes back only as queued records are written.
func (l *Log) waitBudget(n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiters.Add(1)
	defer l.waiters.Add(-1)
	signal(l.wsig)
	for l.budget.Load() < n && l.sick.Load() == nil && !l.closed {
		l.cond.Wait()
	}
	return l.sick.Load() == nil && !l.closed
}

// bounded reports whether the budget tracks reserved space. Call with
// iomu held.
func (l *Log) bounded() bool { return l.reserve > 0 && !l.noFalloc }

// account brings the budget in line with the space now reserved past the
// file's end, plus extra bytes of promises kept (records written). Call
// with iomu held, after every change of l.size or l.reserved.
func (l *Log) account(extra int64) {
	if !l.bounded() {
		return
	}
	now := max(l.reserved-l.size, 0)
	d := now - l.ahead + extra
	l.ahead = now
	if d != 0 {
		l.give(d)
	}
}

// encode encodes e, all but seq and prev, into b, cutting long fields so
// that the result is at most maxRecord bytes; head is where its head part
// ends.
func encode(b []byte, e *Event) (_ []byte, head int) {
	b = appendHead(b[:0], e)
	head = len(b)
	b = appendTail(b, e)
	for limit := 512; len(b) > maxRecord; limit /= 2 {
		c := *e
		c.cut(limit)
		b = appendHead(b[:0], &c)
		head = len(b)
		b = appendTail(b, &c)
	}
	return b, head
}

// cut shortens every string field longer than limit bytes to its first
// limit bytes (whole runes) and "…".
func (e *Event) cut(limit int) {
	if len(e.Guarantees) > limit {
		// A JSON value cut short is not JSON: say how long it was instead.
		e.Guarantees = `{"cut":` + strconv.Itoa(len(e.Guarantees)) + `}`
	}
	for _, s := range []*string{&e.Type, &e.ToolName, &e.Runner, &e.ResolvedSource, &e.Capability,
		&e.GuaranteeSource, &e.Reason, &e.Sub, &e.ChatID, &e.ChatType, &e.Tool,
		&e.Kind, &e.Protocol, &e.Required, &e.Layer, &e.Explanation, &e.CapabilityID,
		&e.Decision, &e.Gate, &e.Code, &e.InputSHA256, &e.RequestID, &e.ClientInvocationID, &e.ApprovalID, &e.FlowID,
		&e.AccountRef, &e.Detail} {
		if len(*s) > limit {
			n := limit
			for n > 0 && !utf8.RuneStart((*s)[n]) {
				n--
			}
			*s = (*s)[:n] + "…"
		}
	}
}
