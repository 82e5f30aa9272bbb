package router

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter is a token bucket per (caller, tool).
type limiter struct {
	on      bool
	limit   rate.Limit
	burst   int
	now     func() time.Time
	mu      sync.Mutex
	buckets map[[2]string]*rate.Limiter
}

func (l *limiter) init(rl RateLimit, now func() time.Time) {
	if rl.PerMinute <= 0 {
		return
	}
	burst := rl.Burst
	if burst == 0 {
		burst = max(1, int(rl.PerMinute/6)) // ten seconds' worth
	}
	l.on, l.limit, l.burst, l.now = true, rate.Limit(rl.PerMinute/60), burst, now
	l.buckets = map[[2]string]*rate.Limiter{}
}

func (l *limiter) allow(sub, toolID string) bool {
	if !l.on {
		return true
	}
	key := [2]string{sub, toolID}
	l.mu.Lock()
	b, ok := l.buckets[key]
	if !ok {
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[key] = b
	}
	l.mu.Unlock()
	return b.AllowN(l.now(), 1)
}
