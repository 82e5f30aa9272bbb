package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/router/state"
)

// Approval is an operator's approval of one call (router/state).
type Approval = state.Approval

// MaxApprovalInput bounds the input kept with an approval for display.
const MaxApprovalInput = state.MaxApprovalInput

// ErrApproval is matched (errors.Is) by every refusal of Approve; the
// reasons below tell them apart, and *ApprovalError carries the details.
var ErrApproval = errors.New("store: approval refused")

// Reasons Approve refuses, matched with errors.Is. ErrApprovalNotFound is
// also ErrNotFound.
var (
	ErrApprovalNotFound = errors.New("no such approval")
	ErrApprovalExpired  = errors.New("approval expired")
	ErrApprovalApproved = errors.New("approval already approved")
	ErrApprovalUsed     = errors.New("approval already used")
	ErrApprovalDenied   = errors.New("approval denied")
)

// ApprovalError says why Approve refused, in words for an operator.
type ApprovalError struct {
	ID     string
	Reason error // one of ErrApprovalNotFound, ErrApprovalExpired, ErrApprovalApproved, ErrApprovalUsed
	// Approval is the approval as it stands; nil when not found.
	Approval *Approval
}

func (e *ApprovalError) Error() string {
	a := e.Approval
	switch {
	case e.Reason == ErrApprovalNotFound || a == nil:
		return fmt.Sprintf("approval %s not found: unknown, or expired and pruned", e.ID)
	case e.Reason == ErrApprovalExpired:
		return fmt.Sprintf("approval %s expired at %s; the caller has to make the call again for a new one",
			e.ID, a.ExpiresAt.Format(time.RFC3339))
	case e.Reason == ErrApprovalApproved:
		return fmt.Sprintf("approval %s was already approved by %s at %s", e.ID, a.ApprovedBy, a.ApprovedAt.Format(time.RFC3339))
	case e.Reason == ErrApprovalUsed:
		return fmt.Sprintf("approval %s was already used at %s", e.ID, a.UsedAt.Format(time.RFC3339))
	case e.Reason == ErrApprovalDenied:
		return fmt.Sprintf("approval %s was denied by %s at %s", e.ID, a.DeniedBy, a.DeniedAt.Format(time.RFC3339))
	}
	return fmt.Sprintf("approval %s: %v", e.ID, e.Reason)
}

func (e *ApprovalError) Unwrap() []error {
	if e.Reason == ErrApprovalNotFound {
		return []error{ErrApproval, e.Reason, ErrNotFound}
	}
	return []error{ErrApproval, e.Reason}
}

const approvalCols = `id, sub, tool_id, input_hash, created_at, expires_at, approved_at, approved_by, used_at, input, input_size, denied_at, denied_by, note`

type scanner interface{ Scan(dest ...any) error }

func scanApproval(row scanner) (*Approval, error) {
	var a Approval
	var created, expires, approved, used, denied sql.NullInt64
	var by, deniedBy, note sql.NullString
	var size sql.NullInt64
	if err := row.Scan(&a.ID, &a.Sub, &a.ToolID, &a.InputHash, &created, &expires, &approved, &by, &used,
		&a.Input, &size, &denied, &deniedBy, &note); err != nil {
		return nil, err
	}
	a.DeniedAt, a.DeniedBy, a.Note = fromMS(denied), deniedBy.String, note.String
	a.InputSize = int(size.Int64)
	a.CreatedAt, a.ExpiresAt = fromMS(created), fromMS(expires)
	a.ApprovedAt, a.UsedAt = fromMS(approved), fromMS(used)
	a.ApprovedBy = by.String
	return &a, nil
}

// RequestApproval asks for an operator's approval of sub calling toolID
// with input (canonical), whose hash is inputHash, valid for ttl. The
// input is kept, its first MaxApprovalInput bytes, for the operator to
// read. While an earlier request with the same binding is live and
// unused, it returns that one, so retries of a call wait on one approval.
func (s *Store) RequestApproval(ctx context.Context, sub, toolID, inputHash string, input []byte, ttl time.Duration) (*Approval, error) {
	switch {
	case sub == "" || toolID == "" || inputHash == "":
		return nil, errors.New("store: request approval: sub, tool id and input hash are required")
	case ttl <= 0:
		return nil, fmt.Errorf("store: request approval: ttl %v is not positive", ttl)
	}
	now := s.nowMS()
	// The transaction begins IMMEDIATE (see the DSN): two requests for one
	// binding are serialised and the second finds the first's row.
	// PostgreSQL takes a pg_advisory_xact_lock on the binding instead (two
	// bindings that share a lock key only wait for each other).
	tx, err := s.ops.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: request approval: %w", err)
	}
	defer tx.Rollback()
	if s.dialect == dialectPG {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(?, 0))`,
			sub+" "+toolID+" "+inputHash); err != nil {
			return nil, fmt.Errorf("store: request approval: %w", err)
		}
	}
	a, err := scanApproval(tx.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals
		WHERE sub = ? AND tool_id = ? AND input_hash = ? AND used_at IS NULL AND expires_at > ?
		ORDER BY created_at DESC, id DESC LIMIT 1`, sub, toolID, inputHash, now))
	if err == nil {
		return a, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: request approval: %w", err)
	}
	a = &Approval{
		ID:        newID("apr_"),
		Sub:       sub,
		ToolID:    toolID,
		InputHash: inputHash,
		CreatedAt: time.UnixMilli(now),
		ExpiresAt: time.UnixMilli(now + ttl.Milliseconds()),
		Input:     input[:min(len(input), MaxApprovalInput)],
		InputSize: len(input),
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO approvals
		(id, sub, tool_id, input_hash, created_at, expires_at, input, input_size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, a.Sub, a.ToolID, a.InputHash, now, ms(a.ExpiresAt), a.Input, a.InputSize); err != nil {
		return nil, fmt.Errorf("store: request approval: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: request approval: %w", err)
	}
	return a, nil
}

// Approve approves the pending approval id on behalf of by. Only a
// pending, unexpired approval can be approved; any other is an
// *ApprovalError saying why (not found, expired, already approved, denied,
// used).
func (s *Store) Approve(ctx context.Context, id, by string) (*Approval, error) {
	return s.decide(ctx, id, by, "", true)
}

// ApproveNote is Approve with the operator's note kept beside it.
func (s *Store) ApproveNote(ctx context.Context, id, by, note string) (*Approval, error) {
	return s.decide(ctx, id, by, note, true)
}

// Deny denies the pending approval id on behalf of by, with an optional
// note for the caller. The caller's call fails with approval_denied, and
// so does the same call again while the denial lives (until it expires).
// It refuses as Approve does.
func (s *Store) Deny(ctx context.Context, id, by, note string) (*Approval, error) {
	return s.decide(ctx, id, by, note, false)
}

// decide approves or denies the pending approval id: one conditional
// update, so that of an approve and a deny racing, one wins.
func (s *Store) decide(ctx context.Context, id, by, note string, approve bool) (*Approval, error) {
	verb, set := "approve", `approved_at = ?, approved_by = ?`
	if !approve {
		verb, set = "deny", `denied_at = ?, denied_by = ?`
	}
	if by == "" {
		return nil, fmt.Errorf("store: %s: say who decides", verb)
	}
	var noteArg any
	if note != "" {
		noteArg = note
	}
	now := s.nowMS()
	a, err := scanApproval(s.ops.QueryRowContext(ctx, `UPDATE approvals SET `+set+`, note = ?
		WHERE id = ? AND approved_at IS NULL AND denied_at IS NULL AND used_at IS NULL AND expires_at > ?
		RETURNING `+approvalCols, now, by, noteArg, id, now))
	if err == nil {
		return a, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: %s: %w", verb, err)
	}
	// Refused: find out why. An approval only moves forward (pending,
	// approved or denied, used; live, expired), so what is read now still
	// explains the refusal.
	a, err = scanApproval(s.ops.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, &ApprovalError{ID: id, Reason: ErrApprovalNotFound}
	case err != nil:
		return nil, fmt.Errorf("store: %s: %w", verb, err)
	case !a.UsedAt.IsZero():
		return nil, &ApprovalError{ID: id, Reason: ErrApprovalUsed, Approval: a}
	case ms(a.ExpiresAt) <= now:
		return nil, &ApprovalError{ID: id, Reason: ErrApprovalExpired, Approval: a}
	case a.Denied():
		return nil, &ApprovalError{ID: id, Reason: ErrApprovalDenied, Approval: a}
	case a.Approved():
		return nil, &ApprovalError{ID: id, Reason: ErrApprovalApproved, Approval: a}
	}
	// Pending and live after all: the clock went back. Say so rather
	// than guess.
	return nil, fmt.Errorf("store: %s %s: refused, then found pending; is the clock moving backwards?", verb, id)
}

// Approval returns the approval id as it stands, live or not;
// ErrNotFound when there is none (unknown, or pruned).
func (s *Store) Approval(ctx context.Context, id string) (*Approval, error) {
	a, err := scanApproval(s.ops.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: approval: %w", err)
	}
	return a, nil
}

// ApprovalFor returns, without using it, the approval UseApproval would
// use now; ErrNotFound when there is none. It lets a call check its
// approval early and use it only once every other gate has passed.
func (s *Store) ApprovalFor(ctx context.Context, sub, toolID, inputHash string) (*Approval, error) {
	a, err := scanApproval(s.ops.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals
		WHERE sub = ? AND tool_id = ? AND input_hash = ?
		  AND approved_at IS NOT NULL AND used_at IS NULL AND expires_at > ?
		ORDER BY approved_at, id LIMIT 1`, sub, toolID, inputHash, s.nowMS()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: approval for: %w", err)
	}
	return a, nil
}

// UseApproval consumes one approved, unused, unexpired approval bound to
// exactly (sub, toolID, inputHash) and returns it; ErrNotFound when there
// is none. One statement marks it used, so it serves one call only.
func (s *Store) UseApproval(ctx context.Context, sub, toolID, inputHash string) (*Approval, error) {
	now := s.nowMS()
	// The outer used_at IS NULL keeps this single-use on PostgreSQL too,
	// where READ COMMITTED re-checks it after waiting on a racing update.
	a, err := scanApproval(s.ops.QueryRowContext(ctx, `UPDATE approvals SET used_at = ?
		WHERE used_at IS NULL AND id = (
			SELECT id FROM approvals
			WHERE sub = ? AND tool_id = ? AND input_hash = ?
			  AND approved_at IS NOT NULL AND used_at IS NULL AND expires_at > ?
			ORDER BY approved_at, id LIMIT 1)
		RETURNING `+approvalCols, now, sub, toolID, inputHash, now))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: use approval: %w", err)
	}
	return a, nil
}

// Approvals lists the live approvals (not used, not expired), pending and
// approved, newest first; on SQLite, requests made in the same millisecond
// in the order they were made (the row id), not by their random ids.
// PostgreSQL has no row id: there the tie goes by id, as replicas' clocks
// would not order such requests anyway.
func (s *Store) Approvals(ctx context.Context) ([]Approval, error) {
	tie := "rowid"
	if s.dialect == dialectPG {
		tie = "id"
	}
	rows, err := s.ops.QueryContext(ctx, `SELECT `+approvalCols+` FROM approvals
		WHERE used_at IS NULL AND expires_at > ?
		ORDER BY created_at DESC, `+tie+` DESC`, s.nowMS())
	if err != nil {
		return nil, fmt.Errorf("store: approvals: %w", err)
	}
	defer rows.Close()
	var out []Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("store: approvals: %w", err)
		}
		out = append(out, *a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: approvals: %w", err)
	}
	return out, nil
}
