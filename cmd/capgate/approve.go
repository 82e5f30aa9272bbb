package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/store"
)

func newApproveCmd() *cobra.Command {
	var configPath, by string
	cmd := &cobra.Command{
		Use:   "approve ID",
		Short: "Approve a call that waits for an operator (apr_...)",
		Long: `approve approves the pending approval ID in the store under the config's
data_dir. A tool of the unrestricted tier runs only with an operator's
approval, bound to the caller, the tool and the exact input: the caller is
told the id (approval_required) and makes the same call again once it is
approved. An approval serves one call and expires; capgate approvals lists
the live ones. approve needs no store key: approvals are not in the vault.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if by == "" {
				return usageError("--by: say who approves")
			}
			ctx := context.Background()
			st, err := openOpsStore(ctx, configPath)
			if err != nil {
				return err
			}
			defer st.Close()
			a, err := st.Approve(ctx, args[0], by)
			if errors.Is(err, store.ErrApprovalNotFound) {
				hint := "capgate approvals --config " + configPath + " lists the live ones"
				if !approvalID.MatchString(args[0]) {
					hint = "approval ids are apr_ and 32 hex digits; " + hint
				}
				return &exitError{code: exitDenied, err: fmt.Errorf("%w (%s)", err, hint)}
			}
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			if jsonOutput(cmd) {
				return printApprovalJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved %s for %s: %s (input sha256 %s…), valid until %s\ninput: %s\n",
				a.ID, a.Sub, a.ToolID, shortHash(a.InputHash), a.ExpiresAt.Format(time.RFC3339), showInput(a, maxShownInput))
			return nil
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml whose data_dir holds the store")
	cmd.Flags().StringVar(&by, "by", defaultApprover(), "who approves, for the record")
	cmd.Flags().Bool("json", false, "print the approval as one JSON object, as capgate approvals --json lists it")
	return cmd
}

func newApprovalsCmd() *cobra.Command {
	var configPath string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List the live approvals: pending and approved, not used, not expired",
		Long: `approvals lists, newest first, the approvals in the store under the config's
data_dir that are neither used nor expired. A pending one waits for
capgate approve ID; an approved one waits for its caller to repeat the call.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			st, err := openOpsStore(ctx, configPath)
			if err != nil {
				return err
			}
			defer st.Close()
			list, err := st.Approvals(ctx)
			if err != nil {
				return &exitError{code: exitDenied, err: err}
			}
			if asJSON {
				return printApprovalsJSON(cmd.OutOrStdout(), list)
			}
			return printApprovals(cmd.OutOrStdout(), list)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml whose data_dir holds the store")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// openOpsStore opens the operation data (not the credential vault, so no
// key is needed) under the config's data_dir, beside a running server.
func openOpsStore(ctx context.Context, configPath string) (*store.Store, error) {
	cfg, err := config.Load(configPath)
	if err != nil {
		return nil, usageError("%v", err)
	}
	st, err := store.Open(ctx, cfg.Server.DataDir, store.Options{WithoutVault: true, URL: cfg.Store.URL})
	if err != nil {
		key := "server.data_dir"
		if cfg.Store.URL != "" {
			key = "store.url" // the error shows the URL without its password
		}
		return nil, &exitError{code: exitDenied, err: fmt.Errorf("%s: %s: %w", cfg.Path, key, err)}
	}
	return st, nil
}

var approvalID = regexp.MustCompile(`^apr_[0-9a-f]{32}$`)

// defaultApprover is $USER, else "operator".
func defaultApprover() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "operator"
}

// shortHash is the first 12 hex digits of an input hash, with or without a
// "sha256:" prefix.
func shortHash(h string) string {
	h = strings.TrimPrefix(h, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// How much of an approval's input is shown: in the list, and by approve.
const (
	maxListedInput = 60
	maxShownInput  = 4096
)

// showInput is the approval's input for a terminal, cut to max bytes.
// Characters that could hide or reorder what is shown (controls, format
// characters such as bidi overrides) are written as \u escapes.
func showInput(a *store.Approval, max int) string {
	if a.InputSize == 0 && len(a.Input) == 0 {
		return "(not recorded)"
	}
	in, cut := a.Input, a.InputTruncated()
	if len(in) > max {
		in, cut = in[:max], true
	}
	var b strings.Builder
	for len(in) > 0 {
		r, size := utf8.DecodeRune(in)
		switch {
		case r == utf8.RuneError && size == 1:
			if len(in) < utf8.UTFMax && cut {
				in = nil // a character cut at the end
				continue
			}
			fmt.Fprintf(&b, "\\x%02x", in[0])
		case r < 0x20 || r == 0x7f || unicode.Is(unicode.Cf, r) || !unicode.IsPrint(r) && r != ' ':
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
		in = in[size:]
	}
	if cut {
		fmt.Fprintf(&b, "… (%d bytes in all)", a.InputSize)
	}
	return b.String()
}

func approvalState(a *store.Approval) string {
	if a.Approved() {
		return "approved"
	}
	return "pending"
}

func printApprovals(w io.Writer, list []store.Approval) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no live approvals")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSUB\tTOOL\tINPUT\tSHA256\tSTATE\tEXPIRES")
	for i := range list {
		a := &list[i]
		state := approvalState(a)
		if a.Approved() {
			state += " by " + a.ApprovedBy
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s…\t%s\t%s\n", a.ID, a.Sub, a.ToolID, showInput(a, maxListedInput),
			shortHash(a.InputHash), state, a.ExpiresAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

type approvalJSON struct {
	ID         string     `json:"id"`
	Sub        string     `json:"sub"`
	ToolID     string     `json:"tool_id"`
	InputHash  string     `json:"input_hash"`
	State      string     `json:"state"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	ApprovedAt *time.Time `json:"approved_at,omitempty"`
	ApprovedBy string     `json:"approved_by,omitempty"`
	// Input is the canonical input the call runs with (its start when
	// InputTruncated), for the operator to read.
	Input          string `json:"input"`
	InputSize      int    `json:"input_size"`
	InputTruncated bool   `json:"input_truncated,omitempty"`
}

func printApprovalsJSON(w io.Writer, list []store.Approval) error {
	out := make([]approvalJSON, 0, len(list))
	for i := range list {
		out = append(out, toApprovalJSON(&list[i]))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// printApprovalJSON prints one approval as approvals --json lists it.
func printApprovalJSON(w io.Writer, a *store.Approval) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(toApprovalJSON(a))
}

func toApprovalJSON(a *store.Approval) approvalJSON {
	j := approvalJSON{
		ID: a.ID, Sub: a.Sub, ToolID: a.ToolID, InputHash: a.InputHash, State: approvalState(a),
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, ApprovedBy: a.ApprovedBy,
		Input: string(a.Input), InputSize: a.InputSize, InputTruncated: a.InputTruncated(),
	}
	if a.Approved() {
		t := a.ApprovedAt
		j.ApprovedAt = &t
	}
	return j
}
