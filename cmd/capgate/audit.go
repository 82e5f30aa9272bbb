package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/token"
)

func newAuditCmd() *cobra.Command {
	var configPath, file string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Verify and read the audit log",
		Long: `audit works on the audit log: the file [audit] path of the config (--config,
default ./capgate.toml; by default <data_dir>/audit.jsonl), or the file given
with --file. The log is JSON lines, one per event, each holding the SHA-256
of the line before it; <log>.head records the last line synced.`,
	}
	cmd.PersistentFlags().StringVar(&configPath, "config", "capgate.toml", "the capgate.toml whose audit log to use")
	cmd.PersistentFlags().StringVar(&file, "file", "", "the audit log file, instead of the config's")
	// logPath is the log to read, and the key its .head is MACed with as
	// far as this process can know it: the config's token secret, or
	// with --file or FILEs $CAPGATE_TOKEN_SECRET; nil when there is none.
	logPath := func(cmd *cobra.Command) (string, []byte, error) {
		if cmd.Flags().Changed("file") {
			if cmd.Flags().Changed("config") {
				return "", nil, usageError("give --config or --file, not both")
			}
			if file == "" {
				return "", nil, usageError("--file: empty path")
			}
			return file, envHeadKey(), nil
		}
		cfg, err := config.Load(configPath)
		if err != nil {
			return "", nil, usageError("%v", err)
		}
		key, err := configHeadKey(cfg)
		if err != nil {
			return "", nil, usageError("%v", err)
		}
		return cfg.Audit.Path, key, nil
	}

	verify := &cobra.Command{
		Use:   "verify [FILE...]",
		Short: "Check the audit log's hash chain and its .head sidecar",
		Long: `verify reads the whole audit log and checks that every line is a record whose
seq is its line number and whose prev is the SHA-256 of the line before it,
then that the file agrees with its .head sidecar. With capgate's token key
(the config's, or $CAPGATE_TOKEN_SECRET for --file and FILEs) it also checks
the sidecar's MAC, so a log cut back with its .head rewritten, stripped or
removed is found; without the key that goes unseen. A log rotated by
[audit] max_size is followed across its moved-aside files, <log>.<seq>,
oldest first; verify names them, and says so when the oldest were pruned. It names the first line
where a line was edited, removed, inserted or reordered, or says that lines
were cut off the end.

Given FILEs (the logs of several replicas, each writing its own), it checks
each chain on its own and reports on each file.

Exit status: 0 when the log is intact, 1 when it is not, 2 when it cannot be
read. With --json, stdout holds one object {"ok","logs"} with an entry per
log (its "state": intact, broken or unreadable).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				if cmd.Flags().Changed("file") || cmd.Flags().Changed("config") {
					return usageError("give FILEs, --config or --file, not several")
				}
				if asJSON {
					return verifyFilesJSON(cmd.OutOrStdout(), args, envHeadKey())
				}
				return verifyFiles(cmd.OutOrStdout(), args, envHeadKey())
			}
			path, key, err := logPath(cmd)
			if err != nil {
				return err
			}
			if asJSON {
				return verifyFilesJSON(cmd.OutOrStdout(), []string{path}, key)
			}
			rep, err := audit.VerifyFileKeyed(path, key)
			var ve *audit.VerifyError
			if errors.As(err, &ve) {
				return &exitError{code: exitDenied, err: err}
			}
			if err != nil {
				return usageError("%v", err)
			}
			printReport(cmd.OutOrStdout(), path, rep)
			return nil
		},
	}

	verify.Flags().BoolVar(&asJSON, "json", false, `print one JSON object on stdout: {"ok","logs":[{"file","state","problem","lines","head","files","first_seq","sidecar","keyed"}]}`)

	var n int
	tail := &cobra.Command{
		Use:   "tail [FILE...]",
		Short: "Print the last lines of the audit log, as they are",
		Long: `tail prints the last lines of the audit log as they are. Given FILEs (the logs
of several replicas), it prints the last lines of all of them merged in time
order; each record names its replica.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 0 {
				return usageError("-n %d: want 0 or more lines", n)
			}
			var b []byte
			if len(args) > 0 {
				if cmd.Flags().Changed("file") || cmd.Flags().Changed("config") {
					return usageError("give FILEs, --config or --file, not several")
				}
				var err error
				if b, err = audit.MergeTail(args, n); err != nil {
					return usageError("%v", err)
				}
			} else {
				path, _, err := logPath(cmd)
				if err != nil {
					return err
				}
				if b, err = audit.TailFile(path, n); err != nil {
					return usageError("%v", err)
				}
			}
			if len(b) > 0 && b[len(b)-1] != '\n' {
				b = append(b, '\n') // an incomplete last line
			}
			_, err := cmd.OutOrStdout().Write(b)
			return err
		},
	}
	tail.Flags().IntVarP(&n, "lines", "n", 20, "how many lines")
	tail.Flags().Bool("json", false, "fail with a JSON error line too (the records are JSON lines already)")

	cmd.AddCommand(verify, tail)
	return cmd
}

// printReport says what VerifyFile found of the log at path.
func printReport(out io.Writer, path string, rep audit.Report) {
	if len(rep.Files) > 1 {
		fmt.Fprintf(out, "checked %d files, in chain order:\n", len(rep.Files))
		for _, f := range rep.Files {
			fmt.Fprintf(out, "  %s\n", f)
		}
	}
	if rep.FirstSeq > 1 {
		fmt.Fprintf(out, "note: the chain is checked from seq %d: the files holding seq 1 to %d were pruned ([audit] max_files) or removed\n", rep.FirstSeq, rep.FirstSeq-1)
	}
	fmt.Fprintf(out, "%s: %d lines, chain intact (head %s)\n", path, rep.Lines, rep.Head)
	switch {
	case rep.Keyed:
		fmt.Fprintf(out, "%s.head verified with capgate's key: no line was cut off the end since it was written\n", path)
	case !rep.Sidecar:
		fmt.Fprintf(out, "note: no %s.head sidecar, so lines cut off the end would go unseen\n", path)
	default:
		fmt.Fprintf(out, "note: checked without capgate's key, so a log cut back with its .head rewritten would pass\n")
	}
}

// auditVerifyResult is what `audit verify --json` prints.
type auditVerifyResult struct {
	OK   bool             `json:"ok"` // every log intact
	Logs []auditLogResult `json:"logs"`
}

// auditLogResult is one log's verdict: state intact, broken (problem
// names the first line found wrong, line its number or 0) or unreadable;
// the rest is audit.Report, zero unless intact.
type auditLogResult struct {
	File     string   `json:"file"`
	State    string   `json:"state"`
	Problem  string   `json:"problem"`
	Line     int      `json:"line"`
	Lines    int      `json:"lines"`
	Head     string   `json:"head"`
	Files    []string `json:"files"`
	FirstSeq uint64   `json:"first_seq"`
	Sidecar  bool     `json:"sidecar"`
	Keyed    bool     `json:"keyed"`
}

// verifyFilesJSON is verifyFiles with --json, for one log or several:
// exit 1 when any is broken, 2 when any cannot be read and none is broken.
func verifyFilesJSON(out io.Writer, paths []string, key []byte) error {
	res := auditVerifyResult{OK: true, Logs: []auditLogResult{}}
	var broken, unreadable int
	for _, path := range paths {
		rep, err := audit.VerifyFileKeyed(path, key)
		l := auditLogResult{File: path, State: "intact", Files: []string{}}
		var ve *audit.VerifyError
		switch {
		case errors.As(err, &ve):
			l.State, l.Problem, l.Line = "broken", err.Error(), ve.Line
			broken++
		case err != nil:
			l.State, l.Problem = "unreadable", err.Error()
			unreadable++
		default:
			l.Lines, l.Head, l.FirstSeq, l.Sidecar, l.Keyed = rep.Lines, rep.Head, rep.FirstSeq, rep.Sidecar, rep.Keyed
			l.Files = append(l.Files, rep.Files...)
		}
		res.OK = res.OK && err == nil
		res.Logs = append(res.Logs, l)
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	switch {
	case broken > 0:
		return &exitError{code: exitDenied}
	case unreadable > 0:
		return &exitError{code: exitUsage}
	}
	return nil
}

// envHeadKey is the .head key of $CAPGATE_TOKEN_SECRET, or nil.
func envHeadKey() []byte {
	if v := strings.TrimSpace(os.Getenv("CAPGATE_TOKEN_SECRET")); v != "" {
		return audit.HeadKey(token.ParseSecret(v))
	}
	return nil
}

// configHeadKey is the .head key of the token secret serve would use
// with cfg: nil without HS256, or when there is no secret yet (verify
// makes no development key).
func configHeadKey(cfg *config.Config) ([]byte, error) {
	if !cfg.Auth.HS256() {
		return nil, nil
	}
	if _, set := os.LookupEnv(cfg.Auth.SecretEnv); !set {
		if _, err := os.Stat(filepath.Join(cfg.Server.DataDir, app.DevSecretFile)); err != nil {
			return nil, nil
		}
	}
	secret, _, err := app.Secret(cfg, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	return audit.HeadKey(secret), nil
}

// verifyFiles checks each of several logs on its own (each replica writes
// its own chain) and reports on every one: exit 1 when any is broken, 2
// when any cannot be read and none is broken.
func verifyFiles(out io.Writer, paths []string, key []byte) error {
	var broken, unreadable []string
	for _, path := range paths {
		rep, err := audit.VerifyFileKeyed(path, key)
		var ve *audit.VerifyError
		switch {
		case errors.As(err, &ve):
			fmt.Fprintf(out, "%s: BROKEN: %v\n", path, err)
			broken = append(broken, path)
		case err != nil:
			fmt.Fprintf(out, "%s: UNREADABLE: %v\n", path, err)
			unreadable = append(unreadable, err.Error())
		default:
			printReport(out, path, rep)
		}
	}
	switch {
	case len(broken) > 0:
		return &exitError{code: exitDenied, err: fmt.Errorf("%d of %d logs are not as they were written: %s", len(broken), len(paths), strings.Join(broken, ", "))}
	case len(unreadable) > 0:
		return usageError("%d of %d logs cannot be read: %s", len(unreadable), len(paths), strings.Join(unreadable, "; "))
	}
	return nil
}
