// Package tool is capgate's shared vocabulary: tool descriptors, calls,
// results, the Source interface every tool source implements, and the
// stable error codes. It imports only risk.
package tool

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable error code: the same in MCP results, RPC errors, the CLI
// and the audit log.
type Code string

const (
	CodeNotFound           Code = "capability_not_found"
	CodeAccessDenied       Code = "capability_access_denied"
	CodeAuthRequired       Code = "capability_auth_required"
	CodeAuthFlowInvalid    Code = "capability_auth_flow_invalid"
	CodeInvalidInput       Code = "capability_invalid_input"
	CodeInvalidOutput      Code = "capability_invalid_output"
	CodeBackendUnavailable Code = "capability_backend_unavailable"
	CodePermissionDenied   Code = "permission_denied"
	CodeAcknowledgeNeeded  Code = "acknowledge_required"
	CodeApprovalRequired   Code = "approval_required"
	CodeApprovalDenied     Code = "approval_denied"
	CodeTokenInvalid       Code = "token_invalid"
	CodeRateLimited        Code = "rate_limited"
	// CodeInternal is what any error that is not an *Error reads as: a bug
	// or an unexpected failure, whose details stay in the log.
	CodeInternal Code = "internal_error"
)

// Error is an error with a stable code and a message safe to show the
// caller. Denials also name the gate, the required capability string and
// what would allow the call.
type Error struct {
	Code     Code
	Message  string
	Gate     string // the router gate that decided, for denials
	Required string // the capability string that was needed
	Hint     string // what would allow it
	// AuthURL, with CodeAuthRequired, is the link where the caller signs in
	// to the account the call needs (an upstream's OAuth sign-in).
	AuthURL string
	// Reason tells refusals of one code apart, for programs (for example
	// "idempotency_in_progress"); RetryAfter, when set, is when a retry
	// may succeed. Both are shown to the caller.
	Reason     string
	RetryAfter time.Duration
	Err        error // the underlying cause; never shown to the caller
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up; 0 when unset.
func (e *Error) RetryAfterSeconds() int {
	if e.RetryAfter <= 0 {
		return 0
	}
	return int((e.RetryAfter + time.Second - 1) / time.Second)
}

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with code and message whose cause is err.
func Wrap(err error, code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err}
}

// ErrorCode returns the code of err, CodeInternal for an error that carries
// none, and "" for nil.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the message of err that is safe to show a caller:
// an *Error's own message, or a generic text for anything else.
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}
