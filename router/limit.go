package router

import (
	"sync"
	"time"
)

// limiter is a token bucket per (caller, tool). A call takes its token
// once every gate but the last steps has passed, and gets it back when a
// later step refuses it (see taken.refund), so a refused call costs the
// caller nothing of its rate.
type limiter struct {
	on      bool
	perSec  float64
	burst   float64
	now     func() time.Time
	mu      sync.Mutex
	buckets map[[2]string]*bucket
}

type bucket struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func (l *limiter) init(rl RateLimit, now func() time.Time) {
	if rl.PerMinute <= 0 {
		return
	}
	burst := rl.Burst
	if burst == 0 {
		burst = max(1, int(rl.PerMinute/6)) // ten seconds' worth
	}
	l.on, l.perSec, l.burst, l.now = true, rl.PerMinute/60, float64(burst), now
	l.buckets = map[[2]string]*bucket{}
}

// take takes one token from the bucket of (sub, toolID), if it has one.
func (l *limiter) take(sub, toolID string) (taken, bool) {
	if !l.on {
		return taken{}, true
	}
	key := [2]string{sub, toolID}
	l.mu.Lock()
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: l.burst, last: l.now()}
		l.buckets[key] = b
	}
	l.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	l.refill(b)
	if b.tokens < 1 {
		return taken{}, false
	}
	b.tokens--
	return taken{b: b, burst: l.burst}, true
}

// wouldTake reports whether take would succeed now, taking nothing and
// making no bucket: planning asks it.
func (l *limiter) wouldTake(sub, toolID string) bool {
	if !l.on {
		return true
	}
	l.mu.Lock()
	b, ok := l.buckets[[2]string{sub, toolID}]
	l.mu.Unlock()
	if !ok {
		return l.burst >= 1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l.refill(b) // as take would: the same tokens, whenever counted
	return b.tokens >= 1
}

// refill adds the tokens earned since the bucket was last counted; b.mu
// is held.
func (l *limiter) refill(b *bucket) {
	if now := l.now(); now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.perSec)
		b.last = now
	}
}

// taken is a token taken from a bucket; the zero value is none.
type taken struct {
	b     *bucket
	burst float64
}

// refund gives the token back.
func (t taken) refund() {
	if t.b == nil {
		return
	}
	t.b.mu.Lock()
	t.b.tokens = min(t.burst, t.b.tokens+1)
	t.b.mu.Unlock()
}
