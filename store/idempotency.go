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
			input_hash = excluded.input_hash, result = excluded.result, claim = NULL, lease_until = NULL,
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
// completed (replay it), in progress (wait), dead (its holder stopped
// renewing it: what the call did is unknown), or of another input.
//
// A claim is a lease: it holds for lease, and its holder keeps it with
// RenewIdempotency while the call runs. One whose holder stops renewing
// (the process died) reads as Dead once lease has passed, and is never
// taken over by a claim: the record, whatever it says, lives keep, and
// only a record past that is replaced. RetakeIdempotency takes over a
// dead claim, for a call its caller knows is safe to repeat.
func (s *Store) ClaimIdempotency(ctx context.Context, sub, toolID, key, inputHash string, lease, keep time.Duration) (string, *IdempotencyRecord, error) {
	if lease <= 0 || keep <= 0 {
		return "", nil, fmt.Errorf("store: claim idempotency: lease %v and keep %v must be positive", lease, keep)
	}
	// A record read between a failed claim and the read may expire or be
	// released in between; then claiming again is right. Twice is plenty.
	for range 3 {
		claim := newID("clm_")
		now := s.nowMS()
		res, err := s.ops.ExecContext(ctx, `INSERT INTO idempotency
			(sub, tool_id, idem_key, input_hash, result, claim, lease_until, created_at, expires_at) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?)
			ON CONFLICT (sub, tool_id, idem_key) DO UPDATE SET
				input_hash = excluded.input_hash, result = NULL, claim = excluded.claim, lease_until = excluded.lease_until,
				created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE idempotency.expires_at <= ?`,
			sub, toolID, key, inputHash, claim, now+lease.Milliseconds(), now, now+keep.Milliseconds(), now)
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
		var created, expires, leaseUntil sql.NullInt64
		now = s.nowMS()
		// A claim made before leases (no lease_until) holds until it expires, as it did.
		err = s.ops.QueryRowContext(ctx, `SELECT input_hash, result, claim IS NOT NULL, COALESCE(lease_until, expires_at), created_at, expires_at
			FROM idempotency WHERE sub = ? AND tool_id = ? AND idem_key = ? AND expires_at > ?`,
			sub, toolID, key, now).Scan(&r.InputHash, &r.Result, &r.InProgress, &leaseUntil, &created, &expires)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("store: claim idempotency: %w", err)
		}
		r.CreatedAt, r.ExpiresAt = fromMS(created), fromMS(expires)
		if r.InProgress {
			r.LeaseUntil = fromMS(leaseUntil)
			r.Dead = leaseUntil.Int64 <= now
		}
		return "", &r, nil
	}
	return "", nil, errors.New("store: claim idempotency: the record kept changing under the claim; retry")
}

// RenewIdempotency extends claim's lease to lease from now: its holder
// calls it while the call runs. ErrNotFound when the claim is no longer
// held (completed, released, taken over, or expired).
func (s *Store) RenewIdempotency(ctx context.Context, sub, toolID, key, claim string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("store: renew idempotency: lease %v is not positive", lease)
	}
	res, err := s.ops.ExecContext(ctx, `UPDATE idempotency SET lease_until = ?
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND claim = ?`,
		s.nowMS()+lease.Milliseconds(), sub, toolID, key, claim)
	if err != nil {
		return fmt.Errorf("store: renew idempotency: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: renew idempotency: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// RetakeIdempotency takes over the dead claim of (sub, toolID, key) made
// with the same input, for a call that is safe to repeat: a new claim id,
// or "" when there is no such dead claim (it completed, was renewed, or
// another caller retook it first: one statement decides).
func (s *Store) RetakeIdempotency(ctx context.Context, sub, toolID, key, inputHash string, lease time.Duration) (string, error) {
	if lease <= 0 {
		return "", fmt.Errorf("store: retake idempotency: lease %v is not positive", lease)
	}
	claim := newID("clm_")
	now := s.nowMS()
	res, err := s.ops.ExecContext(ctx, `UPDATE idempotency SET claim = ?, lease_until = ?, created_at = ?
		WHERE sub = ? AND tool_id = ? AND idem_key = ? AND input_hash = ? AND claim IS NOT NULL
			AND COALESCE(lease_until, expires_at) <= ? AND expires_at > ?`,
		claim, now+lease.Milliseconds(), now, sub, toolID, key, inputHash, now, now)
	if err != nil {
		return "", fmt.Errorf("store: retake idempotency: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return "", fmt.Errorf("store: retake idempotency: %w", err)
	}
	if n == 0 {
		return "", nil
	}
	return claim, nil
}

// CompleteIdempotency records the result of the call that holds claim,
// kept for ttl. ErrNotFound when the claim is no longer held (another
// call retook it, or it expired). A claim read as dead meanwhile still
// completes: its result is known after all, and later retries replay it.
func (s *Store) CompleteIdempotency(ctx context.Context, sub, toolID, key, claim string, result []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("store: complete idempotency: ttl %v is not positive", ttl)
	}
	if result == nil {
		result = []byte{} // NULL is kept for claims
	}
	now := s.nowMS()
	res, err := s.ops.ExecContext(ctx, `UPDATE idempotency SET result = ?, claim = NULL, lease_until = NULL, expires_at = ?
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
