package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/router/state"
	"github.com/capgate/capgate/tool"
)

// Reasons an idempotency gate's refusal gives, beside its code, so that a
// client can tell them apart without reading the message.
const (
	// ReasonInProgress: the key's first attempt still runs (rate_limited,
	// with RetryAfter).
	ReasonInProgress = "idempotency_in_progress"
	// ReasonOutcomeUnknown: the key's first attempt's replica died while
	// the tool ran (capability_backend_unavailable).
	ReasonOutcomeUnknown = "idempotency_outcome_unknown"
)

// holdLease renews claim's lease every third of it until the returned stop
// is called (stop waits for the renewer; calling it again does nothing).
// A renewal that fails is tried again at the next tick: the lease has
// three ticks in it. One that finds the claim gone (retaken after this
// replica was thought dead) stops renewing and says so.
func (r *Router) holdLease(sub, toolID, key, claim string) (stop func()) {
	lease := r.opts.IdempotencyLease
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), lease/3)
			err := r.opts.State.RenewIdempotency(ctx, sub, toolID, key, claim, lease)
			cancel()
			switch {
			case errors.Is(err, state.ErrNotFound):
				r.opts.Logger.Warn("idempotency claim lost while its call runs: another replica took it as dead", "tool", toolID)
				return
			case err != nil:
				r.opts.Logger.Warn("idempotency claim not renewed; retrying", "tool", toolID, "err", err)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-ended
	}
}

// repeatable reports a tool the operator declared safe to run again.
func (r *Router) repeatable(d *tool.Descriptor) bool {
	for _, p := range r.opts.Repeatable {
		if permissions.Match(p, d.ID) {
			return true
		}
	}
	return false
}

// inProgress is the answer to a retry whose key's first attempt still runs.
func (r *Router) inProgress(key string, cause error) *tool.Error {
	e := &tool.Error{Code: tool.CodeRateLimited, Gate: GateIdempotency, Reason: ReasonInProgress, Err: cause,
		RetryAfter: r.opts.IdempotencyLease,
		Hint:       "retry later with the same key and input: you get that call's result"}
	e.Message = fmt.Sprintf("a call with idempotency key %s is still in progress; retry after %d s",
		quoteKey(key), e.RetryAfterSeconds())
	return e
}

// outcomeUnknown is the answer to a retry whose key's first attempt's
// replica died while the tool ran: it may have had its effect or not, and
// running it again could do it twice.
func outcomeUnknown(key string, d *tool.Descriptor, rec *state.IdempotencyRecord) *tool.Error {
	return &tool.Error{Code: tool.CodeBackendUnavailable, Gate: GateIdempotency, Reason: ReasonOutcomeUnknown,
		Message: fmt.Sprintf("the first call with idempotency key %s (started %s) was running %s when its capgate replica died; "+
			"whether it had its effect is unknown, and it is not run again under this key",
			quoteKey(key), rec.CreatedAt.UTC().Format(time.RFC3339), d.ID),
		Hint: "check whether the effect happened; to run it again, use a new idempotency key"}
}
