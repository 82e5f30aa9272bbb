package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// IdempotencyRecord is the outcome of a call made with an idempotency key:
// a retry with the same key and input gets Result again; with another input
// it is refused.
type IdempotencyRecord struct {
	InputHash string
	Result    []byte
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Idempotency returns the live record of (sub, toolID, key), or
// ErrNotFound when there is none or it has expired.
func (s *Store) Idempotency(ctx context.Context, sub, toolID, key string) (*IdempotencyRecord, error) {
	var r IdempotencyRecord
	var created, expires sql.NullInt64
	err := s.ops.QueryRowContext(ctx, rebind(`SELECT input_hash, result, created_at, expires_at FROM idempotency
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND expires_at > ?`),
		sub, toolID, key, s.nowMS()).Scan(&r.InputHash, &r.Result, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: idempotency: %w", err)
	}
	r.CreatedAt, r.ExpiresAt = fromMS(created), fromMS(expires)
	return &r, nil
}

// PutIdempotency records the outcome of (sub, toolID, key) for ttl. The
// first writer wins: while a live record exists it is kept and
// PutIdempotency returns ErrExists; an expired one is replaced.
func (s *Store) PutIdempotency(ctx context.Context, sub, toolID, key, inputHash string, result []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("store: put idempotency: ttl %v is not positive", ttl)
	}
	now := s.nowMS()
	// The conditional upsert is one statement: two writers racing for a key
	// cannot both see "no live record".
	res, err := s.ops.ExecContext(ctx, rebind(`INSERT INTO idempotency
		(sub, tool_id, idem_key, input_hash, result, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sub, tool_id, idem_key) DO UPDATE SET
			input_hash = excluded.input_hash, result = excluded.result,
			created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE idempotency.expires_at <= ?`),
		sub, toolID, key, inputHash, result, now, now+ttl.Milliseconds(), now)
	if err != nil {
		return fmt.Errorf("store: put idempotency: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: put idempotency: %w", err)
	}
	if n == 0 {
		return ErrExists
	}
	return nil
}
