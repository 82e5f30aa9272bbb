package router

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/capgate/capgate/tool"
)

// RateBuckets keeps the rate limit's buckets where every replica sees
// them (a shared store): one take is one atomic statement. Without it the
// buckets live in this process's memory.
type RateBuckets interface {
	TakeToken(ctx context.Context, sub, toolID string, perSec, burst float64) (bool, error)
	RefundToken(ctx context.Context, sub, toolID string, burst float64) error
	PeekToken(ctx context.Context, sub, toolID string, perSec, burst float64) (bool, error)
}

// limiter is a token bucket per (caller, tool). A call takes its token
// once every gate but the last steps has passed, and gets it back when a
// later step refuses it (see taken.refund), so a refused call costs the
// caller nothing of its rate. golang.org/x/time/rate cannot give a token
// back (a Reservation's Cancel restores nothing once its time to act has
// passed), so the bucket is these few lines. A full bucket is the same as
// none, so full ones are forgotten (sweep): the map holds only callers
// that used their rate lately.
type limiter struct {
	on      bool
	perSec  float64
	burst   float64
	now     func() time.Time
	shared  RateBuckets // nil: the buckets below
	log     *slog.Logger
	mu      sync.Mutex
	buckets map[[2]string]*bucket
	sweepAt int // sweep when the map grows to this many buckets
}

type bucket struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
	gone   bool // swept out of the map: look the key up again
}

// minSweep is the map size below which no sweep is made.
const minSweep = 1024

func (l *limiter) init(rl RateLimit, now func() time.Time, shared RateBuckets, log *slog.Logger) {
	if rl.PerMinute <= 0 {
		return
	}
	burst := rl.Burst
	if burst == 0 {
		burst = max(1, int(rl.PerMinute/6)) // ten seconds' worth
	}
	l.on, l.perSec, l.burst, l.now, l.shared, l.log = true, rl.PerMinute/60, float64(burst), now, shared, log
	l.buckets = map[[2]string]*bucket{}
	l.sweepAt = minSweep
}

// take takes one token from the bucket of (sub, toolID), if it has one.
// Only a shared bucket can fail: then the call is refused (fail closed),
// as its budget cannot be known.
func (l *limiter) take(ctx context.Context, sub, toolID string) (taken, bool, error) {
	if !l.on {
		return taken{}, true, nil
	}
	if l.shared != nil {
		ok, err := l.shared.TakeToken(ctx, sub, toolID, l.perSec, l.burst)
		if err != nil {
			return taken{}, false, storeUnavailable(err, GateRateLimit, "the rate limit")
		}
		if !ok {
			return taken{}, false, nil
		}
		return taken{l: l, ctx: context.WithoutCancel(ctx), sub: sub, toolID: toolID}, true, nil
	}
	key := [2]string{sub, toolID}
	var b *bucket
	for {
		l.mu.Lock()
		var ok bool
		if b, ok = l.buckets[key]; !ok {
			if len(l.buckets) >= l.sweepAt {
				l.sweep()
			}
			b = &bucket{tokens: l.burst, last: l.now()}
			l.buckets[key] = b
		}
		l.mu.Unlock()
		b.mu.Lock()
		if !b.gone {
			break
		}
		b.mu.Unlock()
	}
	defer b.mu.Unlock()
	l.refill(b)
	if b.tokens < 1 {
		return taken{}, false, nil
	}
	b.tokens--
	return taken{l: l, b: b}, true, nil
}

// wouldTake reports whether take would succeed now, taking nothing and
// making no bucket: planning asks it.
func (l *limiter) wouldTake(ctx context.Context, sub, toolID string) (bool, error) {
	if !l.on {
		return true, nil
	}
	if l.shared != nil {
		ok, err := l.shared.PeekToken(ctx, sub, toolID, l.perSec, l.burst)
		if err != nil {
			return false, storeUnavailable(err, GateRateLimit, "the rate limit")
		}
		return ok, nil
	}
	l.mu.Lock()
	b, ok := l.buckets[[2]string{sub, toolID}]
	l.mu.Unlock()
	if !ok {
		return l.burst >= 1, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l.refill(b) // as take would: the same tokens, whenever counted
	return b.tokens >= 1, nil
}

// sweep forgets the buckets that are full again; l.mu is held. The next
// sweep waits until the map has doubled, so sweeps cost O(1) per bucket made.
func (l *limiter) sweep() {
	for k, b := range l.buckets {
		b.mu.Lock()
		if l.refill(b); b.tokens >= l.burst {
			b.gone = true
			delete(l.buckets, k)
		}
		b.mu.Unlock()
	}
	l.sweepAt = max(minSweep, 2*len(l.buckets))
}

// refill adds the tokens earned since the bucket was last counted; b.mu
// is held.
func (l *limiter) refill(b *bucket) {
	if now := l.now(); now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.perSec)
		b.last = now
	}
}

// taken is a token taken from a bucket of l; the zero value is none.
type taken struct {
	l *limiter
	b *bucket // the bucket in memory; nil for a shared one
	// a shared bucket's
	ctx         context.Context
	sub, toolID string
}

// refund gives the token back.
func (t taken) refund() {
	switch {
	case t.l == nil:
	case t.b != nil:
		t.b.mu.Lock()
		t.b.tokens = min(t.l.burst, t.b.tokens+1)
		t.b.mu.Unlock()
	default:
		// A lost refund costs the caller one token, never more calls.
		if err := t.l.shared.RefundToken(t.ctx, t.sub, t.toolID, t.l.burst); err != nil {
			t.l.log.Warn("rate-limit token not refunded", "tool", t.toolID, "err", err)
		}
	}
}

// storeUnavailable is the refusal of a call whose state (what, at gate)
// the store could not read or write: it fails closed, as whether the call
// may run cannot be known.
func storeUnavailable(err error, gate, what string) *tool.Error {
	te := tool.Wrap(err, tool.CodeBackendUnavailable, "the store did not answer for %s", what)
	te.Gate, te.Hint = gate, "retry when the store is back"
	return te
}
