package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// A rate limit's token buckets live here when replicas share the store,
// so that a caller's budget is one however many replicas serve it. (On
// SQLite the router keeps them in memory: one process.)
//
// A bucket is one row, refilled and taken from in one statement, so
// concurrent takes on any replicas never spend a token twice. Refill is
// counted on the taking replica's clock and never runs backwards: a clock
// ahead of the others' by d grants at most d×rate tokens early, once.
// That is the tolerance; with clocks in sync (NTP: milliseconds) it is
// below one token at any practical rate.

// bucketElapsed is the milliseconds from the bucket's time to excluded's,
// none when excluded's clock is behind.
const bucketElapsed = `(CASE WHEN excluded.updated_at > rate_buckets.updated_at
		THEN excluded.updated_at - rate_buckets.updated_at ELSE 0 END)`

// bucketRefilled is the bucket's tokens refilled to excluded's time, not
// yet capped.
const bucketRefilled = `rate_buckets.tokens + excluded.per_ms * ` + bucketElapsed

// bucketRefill is the bucket's tokens after refilling to excluded's time,
// capped at its burst.
const bucketRefill = `(CASE WHEN ` + bucketRefilled + ` > excluded.burst THEN excluded.burst
	ELSE ` + bucketRefilled + ` END)`

// TakeToken takes one token from the bucket of (sub, toolID), which
// refills perSec tokens a second up to burst; false when it has none.
func (s *Store) TakeToken(ctx context.Context, sub, toolID string, perSec, burst float64) (bool, error) {
	if burst < 1 || perSec <= 0 {
		return false, fmt.Errorf("store: take token: rate %v/s, burst %v", perSec, burst)
	}
	res, err := s.ops.ExecContext(ctx, `INSERT INTO rate_buckets (sub, tool_id, tokens, updated_at, per_ms, burst)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (sub, tool_id) DO UPDATE SET
			tokens = `+bucketRefill+` - 1,
			updated_at = CASE WHEN excluded.updated_at > rate_buckets.updated_at THEN excluded.updated_at ELSE rate_buckets.updated_at END,
			per_ms = excluded.per_ms, burst = excluded.burst
		WHERE `+bucketRefill+` >= 1`,
		sub, toolID, burst-1, s.nowMS(), perSec/1000, burst)
	if err != nil {
		return false, fmt.Errorf("store: take token: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: take token: %w", err)
	}
	return n == 1, nil
}

// RefundToken gives back a token taken from (sub, toolID), up to burst.
func (s *Store) RefundToken(ctx context.Context, sub, toolID string, burst float64) error {
	if _, err := s.ops.ExecContext(ctx, `UPDATE rate_buckets
		SET tokens = CASE WHEN tokens + 1 > ? THEN ? ELSE tokens + 1 END
		WHERE sub = ? AND tool_id = ?`, burst, burst, sub, toolID); err != nil {
		return fmt.Errorf("store: refund token: %w", err)
	}
	return nil
}

// PeekToken says whether TakeToken would succeed now, taking nothing.
func (s *Store) PeekToken(ctx context.Context, sub, toolID string, perSec, burst float64) (bool, error) {
	var tokens float64
	var updated int64
	err := s.ops.QueryRowContext(ctx, `SELECT tokens, updated_at FROM rate_buckets WHERE sub = ? AND tool_id = ?`,
		sub, toolID).Scan(&tokens, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return burst >= 1, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: peek token: %w", err)
	}
	if d := s.nowMS() - updated; d > 0 {
		tokens = min(burst, tokens+float64(d)*perSec/1000)
	}
	return tokens >= 1, nil
}

// bucketTTL: Prune drops buckets untouched this long; a full bucket is
// the same as none.
const bucketTTL = 24 * time.Hour
