package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/router/state"
)

// Flow is an auth flow under way (router/state).
type Flow = state.Flow

// BeginFlow starts an auth flow for sub, valid for FlowTTL.
func (s *Store) BeginFlow(ctx context.Context, sub, capabilityID, accountHint string, state []byte) (*Flow, error) {
	if sub == "" {
		return nil, errors.New("store: begin flow: empty sub")
	}
	now := s.nowMS()
	f := &Flow{
		ID:           newID("caf_"),
		Sub:          sub,
		CapabilityID: capabilityID,
		AccountHint:  accountHint,
		State:        state,
		CreatedAt:    time.UnixMilli(now),
		ExpiresAt:    time.UnixMilli(now + FlowTTL.Milliseconds()),
	}
	_, err := s.ops.ExecContext(ctx, `INSERT INTO auth_flows
		(id, sub, capability_id, account_hint, state, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		f.ID, f.Sub, f.CapabilityID, f.AccountHint, s.sealFlow(f), now, ms(f.ExpiresAt))
	if err != nil {
		return nil, fmt.Errorf("store: begin flow: %w", err)
	}
	return f, nil
}

// TakeFlow consumes the flow id begun by sub and returns it. It is
// ErrFlowInvalid when the flow is unknown, expired, already taken or was
// begun by another sub; in the last case the flow stays for its owner.
// One statement deletes the row, so of concurrent takers exactly one wins.
func (s *Store) TakeFlow(ctx context.Context, id, sub string) (*Flow, error) {
	return s.scanFlow(s.ops.QueryRowContext(ctx, `DELETE FROM auth_flows
		WHERE id = ? AND sub = ? AND expires_at > ?
		RETURNING `+flowCols, id, sub, s.nowMS()), id, "take flow")
}

// flowCols are the columns scanFlow reads, in its order.
const flowCols = `sub, capability_id, account_hint, state, created_at, expires_at`

// scanFlow reads one flow row (flowCols); no row is ErrFlowInvalid. op
// names the operation in other errors.
func (s *Store) scanFlow(row *sql.Row, id, op string) (*Flow, error) {
	f := &Flow{ID: id}
	var created, expires sql.NullInt64
	err := row.Scan(&f.Sub, &f.CapabilityID, &f.AccountHint, &f.State, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrFlowInvalid
	}
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", op, err)
	}
	f.CreatedAt, f.ExpiresAt = fromMS(created), fromMS(expires)
	if f.State, err = s.openFlow(f); err != nil {
		return nil, err
	}
	return f, nil
}

// A flow's state holds what its callback needs, a PKCE verifier among
// them: with a vault key it is sealed like a credential (AES-256-GCM),
// bound to the flow's id and subject, so the operations database alone
// gives away nothing, and a row edited to name another subject does not
// open.

// sealedFlow marks a sealed state: magic, nonce, ciphertext.
const sealedFlow = "\x00capgate sealed flow v1\x00"

func flowAD(f *Flow) []byte { return credentialAD(f.Sub, "auth flow", f.ID) }

// sealFlow is f.State as stored.
func (s *Store) sealFlow(f *Flow) []byte {
	if s.aead == nil || f.State == nil {
		return f.State
	}
	nonce, ct := s.seal(f.State, flowAD(f))
	return append(append([]byte(sealedFlow), nonce...), ct...)
}

// openFlow is the state of f as read; a state that is not sealed where
// a vault key is set, or does not open, is ErrFlowInvalid.
func (s *Store) openFlow(f *Flow) ([]byte, error) {
	if s.aead == nil || f.State == nil {
		return f.State, nil
	}
	raw, ok := bytes.CutPrefix(f.State, []byte(sealedFlow))
	n := s.aead.NonceSize()
	if !ok || len(raw) < n {
		return nil, ErrFlowInvalid
	}
	pt, err := s.aead.Open(nil, raw[:n], raw[n:], flowAD(f))
	if err != nil {
		return nil, ErrFlowInvalid
	}
	return pt, nil
}

// FlowByID returns the live flow id, whoever began it, without taking it:
// for a link a browser opens, which carries no capgate token. The flow id
// (128 random bits) is the browser's only credential. ErrFlowInvalid when
// it is unknown or expired.
func (s *Store) FlowByID(ctx context.Context, id string) (*Flow, error) {
	return s.scanFlow(s.ops.QueryRowContext(ctx, `SELECT `+flowCols+`
		FROM auth_flows WHERE id = ? AND expires_at > ?`, id, s.nowMS()), id, "flow")
}

// TakeFlowByID consumes the live flow id, whoever began it, and returns
// it with its Sub: an OAuth callback, whose state is the flow id and whose
// browser carries no capgate token. Like TakeFlow, of concurrent takers
// exactly one wins, and an unknown, expired or used flow is ErrFlowInvalid.
func (s *Store) TakeFlowByID(ctx context.Context, id string) (*Flow, error) {
	return s.scanFlow(s.ops.QueryRowContext(ctx, `DELETE FROM auth_flows
		WHERE id = ? AND expires_at > ?
		RETURNING `+flowCols, id, s.nowMS()), id, "take flow")
}
