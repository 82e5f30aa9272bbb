// Package state holds the records and errors the router's State speaks:
// what it keeps between calls (auth flows, idempotency records,
// approvals). It imports nothing of capgate, so the router names them
// without depending on a backend; store (SQLite, PostgreSQL) implements
// router.State with them.
package state

import (
	"errors"
	"time"
)

// Errors callers match with errors.Is.
var (
	// ErrNotFound: no such credential, idempotency record (or an expired
	// one) or usable approval.
	ErrNotFound = errors.New("store: not found")
	// ErrFlowInvalid: TakeFlow of a flow that is unknown, expired, already
	// taken or began by another subject. The four are not told apart, so a
	// caller learns nothing about other subjects' flows.
	ErrFlowInvalid = errors.New("store: auth flow unknown, expired, used or not yours")
)

// Flow is an auth flow under way: begun by Sub for CapabilityID, to be
// completed once, by the same Sub, before ExpiresAt. State is the caller's
// (a PKCE verifier, a redirect target ...).
type Flow struct {
	ID           string // "caf_" + 32 hex: 128 random bits
	Sub          string
	CapabilityID string
	AccountHint  string
	State        []byte
	CreatedAt    time.Time
	ExpiresAt    time.Time
}

// IdempotencyRecord is the outcome of a call made with an idempotency key:
// a retry with the same key and input gets Result again; with another input
// it is refused. While the call that claimed the key runs, InProgress is
// true and Result nil; Dead says its holder stopped renewing its lease
// (LeaseUntil passed), so whether the call ran is unknown.
type IdempotencyRecord struct {
	InputHash  string
	Result     []byte
	InProgress bool
	Dead       bool
	LeaseUntil time.Time
	CreatedAt  time.Time
	ExpiresAt  time.Time
}

// Approval is an operator's approval of one call: bound to the caller
// (Sub), the tool and the exact input (InputHash), short-lived, and used at
// most once. It is pending until approved.
type Approval struct {
	ID        string // "apr_" + 32 hex: 128 random bits
	Sub       string
	ToolID    string
	InputHash string
	CreatedAt time.Time
	ExpiresAt time.Time
	// ApprovedAt and UsedAt are zero while not approved, not used.
	ApprovedAt time.Time
	UsedAt     time.Time
	ApprovedBy string
	// DeniedAt is set, and DeniedBy names the operator, once denied: a
	// denied approval is never approved or used. Note is the operator's
	// word on the decision, either way.
	DeniedAt time.Time
	DeniedBy string
	Note     string
	// Input is the canonical input the call would run with, what the
	// operator approves, cut to MaxApprovalInput bytes; InputSize is its
	// whole length (InputHash is of the whole).
	Input     []byte
	InputSize int
}

// MaxApprovalInput bounds the input kept with an approval for display.
const MaxApprovalInput = 16 << 10

// InputTruncated reports whether Input is only the start of the input.
func (a *Approval) InputTruncated() bool { return len(a.Input) < a.InputSize }

// Approved reports whether an operator has approved a.
func (a *Approval) Approved() bool { return !a.ApprovedAt.IsZero() }

// Denied reports whether an operator has denied a.
func (a *Approval) Denied() bool { return !a.DeniedAt.IsZero() }

// Task is a task an upstream made of a call (the MCP tasks extension),
// under capgate's own id: only Sub, who made the call, may reach it, and
// only through capgate, which relays to ToolID's source for UpstreamID.
type Task struct {
	ID         string // "cgt_" + 32 hex: 128 random bits
	Sub        string
	ToolID     string
	UpstreamID string
	RequestID  string // the invocation that made it (its tool_call record)
	CreatedAt  time.Time
	ExpiresAt  time.Time
}
