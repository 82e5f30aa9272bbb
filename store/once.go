package store

import (
	"context"
	"fmt"
	"time"
)

// ClaimOnce records that key was used, until expires: the first claim of a
// key succeeds, every later one while it lives returns ErrExists, whichever
// process (or replica sharing the store) makes it. capgate claims a sealed
// requestState this way, so that a state is consumed once. A claim that
// has expired may be made again; what it guarded has expired with it.
func (s *Store) ClaimOnce(ctx context.Context, key string, expires time.Time) error {
	if key == "" {
		return fmt.Errorf("store: claim once: empty key")
	}
	now := s.nowMS()
	if ms(expires) <= now {
		return fmt.Errorf("store: claim once: expiry %s is not in the future", expires.UTC().Format(time.RFC3339))
	}
	// One conditional upsert: two claimants racing cannot both see no live row.
	res, err := s.ops.ExecContext(ctx, `INSERT INTO once_claims (claim_key, created_at, expires_at) VALUES (?, ?, ?)
		ON CONFLICT (claim_key) DO UPDATE SET created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE once_claims.expires_at <= ?`, key, now, ms(expires), now)
	if err != nil {
		return fmt.Errorf("store: claim once: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: claim once: %w", err)
	}
	if n == 0 {
		return ErrExists
	}
	return nil
}

// Claimed says whether key is claimed (ClaimOnce) and the claim lives:
// one indexed read, for a check made on every request (an ended MCP
// session) where claiming would be a write.
func (s *Store) Claimed(ctx context.Context, key string) (bool, error) {
	var n int
	err := s.ops.QueryRowContext(ctx, `SELECT COUNT(*) FROM once_claims WHERE claim_key = ? AND expires_at > ?`, key, s.nowMS()).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("store: claimed: %w", err)
	}
	return n > 0, nil
}
