package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/router/state"
)

// IdempotencyRecord is the outcome of a call made with an idempotency key
// (router/state).
type IdempotencyRecord = state.IdempotencyRecord

// Idempotency returns the live, completed record of (sub, toolID, key), or
// ErrNotFound when there is none, it has expired or its call still runs.
func (s *Store) Idempotency(ctx context.Context, sub, toolID, key string) (*IdempotencyRecord, error) {
	var r IdempotencyRecord
	var created, expires sql.NullInt64
	err := s.ops.QueryRowContext(ctx, `SELECT input_hash, result, created_at, expires_at FROM idempotency
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND expires_at > ? AND claim IS NULL`,
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
	res, err := s.ops.ExecContext(ctx, `INSERT INTO idempotency
		(sub, tool_id, idem_key, input_hash, result, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sub, tool_id, idem_key) DO UPDATE SET
			input_hash = excluded.input_hash, result = excluded.result,
			created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE idempotency.expires_at <= ?`,
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

// ClaimIdempotency claims (sub, toolID, key) for one call with the input
// whose hash is inputHash, before the call runs. One statement takes the
// row, so of concurrent callers exactly one gets a claim id; it then
// finishes with CompleteIdempotency or, when the call did not run to a
// result, ReleaseIdempotency. The others get the live record instead:
// completed (replay it), in progress (wait), or of another input.
//
// The claim lasts ttl: a process that dies between claim and completion
// blocks the key that long, no longer. An expired record or claim is
// taken over.
func (s *Store) ClaimIdempotency(ctx context.Context, sub, toolID, key, inputHash string, ttl time.Duration) (string, *IdempotencyRecord, error) {
	if ttl <= 0 {
		return "", nil, fmt.Errorf("store: claim idempotency: ttl %v is not positive", ttl)
	}
	// A record read between a failed claim and the read may expire or be
	// released in between; then claiming again is right. Twice is plenty.
	for range 3 {
		claim := newID("clm_")
		now := s.nowMS()
		res, err := s.ops.ExecContext(ctx, `INSERT INTO idempotency
			(sub, tool_id, idem_key, input_hash, result, claim, created_at, expires_at) VALUES (?, ?, ?, ?, NULL, ?, ?, ?)
			ON CONFLICT (sub, tool_id, idem_key) DO UPDATE SET
				input_hash = excluded.input_hash, result = NULL, claim = excluded.claim,
				created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE idempotency.expires_at <= ?`,
			sub, toolID, key, inputHash, claim, now, now+ttl.Milliseconds(), now)
		if err != nil {
			return "", nil, fmt.Errorf("store: claim idempotency: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return "", nil, fmt.Errorf("store: claim idempotency: %w", err)
		}
		if n == 1 {
			return claim, nil, nil
		}
		var r IdempotencyRecord
		var created, expires sql.NullInt64
		err = s.ops.QueryRowContext(ctx, `SELECT input_hash, result, claim IS NOT NULL, created_at, expires_at
			FROM idempotency WHERE sub = ? AND tool_id = ? AND idem_key = ? AND expires_at > ?`,
			sub, toolID, key, s.nowMS()).Scan(&r.InputHash, &r.Result, &r.InProgress, &created, &expires)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("store: claim idempotency: %w", err)
		}
		r.CreatedAt, r.ExpiresAt = fromMS(created), fromMS(expires)
		return "", &r, nil
	}
	return "", nil, errors.New("store: claim idempotency: the record kept changing under the claim; retry")
}

// CompleteIdempotency records the result of the call that holds claim,
// kept for ttl. ErrNotFound when the claim is no longer held (it expired
// and another call took the key).
func (s *Store) CompleteIdempotency(ctx context.Context, sub, toolID, key, claim string, result []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("store: complete idempotency: ttl %v is not positive", ttl)
	}
	if result == nil {
		result = []byte{} // NULL is kept for claims
	}
	now := s.nowMS()
	res, err := s.ops.ExecContext(ctx, `UPDATE idempotency SET result = ?, claim = NULL, expires_at = ?
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND claim = ?`,
		result, now+ttl.Milliseconds(), sub, toolID, key, claim)
	if err != nil {
		return fmt.Errorf("store: complete idempotency: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: complete idempotency: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// ReleaseIdempotency gives up claim, so that the next call with the key
// runs: for a call that ended without a result to replay. Releasing a
// claim no longer held does nothing.
func (s *Store) ReleaseIdempotency(ctx context.Context, sub, toolID, key, claim string) error {
	if _, err := s.ops.ExecContext(ctx, `DELETE FROM idempotency
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND claim = ?`, sub, toolID, key, claim); err != nil {
		return fmt.Errorf("store: release idempotency: %w", err)
	}
	return nil
}
