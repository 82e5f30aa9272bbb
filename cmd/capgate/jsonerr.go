package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/tool"
)

// With --json a command prints its result as one JSON document on stdout
// and, when it fails, one line on stderr:
//
//	{"error":{"code":"usage","message":"--config is required"}}
//
// (with "hint" when the error says what would allow a refused call).
// code is the stable error code the error carries (permission_denied,
// capability_not_found, ...), else "usage" for exit status 2 (bad flags,
// arguments, files or config) and "failed" for 1. The exit status is the
// text form's. Warnings logged meanwhile are JSON lines too (cliLogger).

// Error codes of a failure that carries no stable code.
const (
	errCodeUsage  = "usage"
	errCodeFailed = "failed"
)

type jsonError struct {
	Error jsonErrorBody `json:"error"`
}

type jsonErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"` // what would allow a refused call
}

// writeJSONError writes err, which ends the command with exit status
// code, as the one JSON line a --json command fails with.
func writeJSONError(w io.Writer, code int, err error) {
	body := jsonErrorBody{Code: errCodeFailed, Message: err.Error()}
	var te *tool.Error
	switch {
	case errors.As(err, &te):
		body.Code, body.Hint = string(te.Code), te.Hint
		if te == err {
			body.Message = te.Message // the code is said once
		}
	case code == exitUsage:
		body.Code = errCodeUsage
	}
	_ = json.NewEncoder(w).Encode(jsonError{body})
}

// jsonOutput says whether cmd was asked for JSON (its --json flag).
func jsonOutput(cmd *cobra.Command) bool {
	if cmd == nil {
		return false
	}
	f := cmd.Flags().Lookup("json")
	return f != nil && f.Value.String() == "true"
}

// jsonAsked says whether args ask for JSON when the flags did not parse
// (an unknown flag or command before --json).
func jsonAsked(args []string) bool {
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	return slices.Contains(args, "--json") || slices.Contains(args, "--json=true")
}

// cliLogger is the logger of what a command's sources warn about while it
// runs: text on w, or JSON lines with --json.
func cliLogger(cmd *cobra.Command, w io.Writer) *slog.Logger {
	o := &slog.HandlerOptions{Level: slog.LevelWarn}
	if jsonOutput(cmd) {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}
