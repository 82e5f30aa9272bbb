package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/config"
)

func newAuditCmd() *cobra.Command {
	var configPath, file string
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
	logPath := func(cmd *cobra.Command) (string, error) {
		if cmd.Flags().Changed("file") {
			if cmd.Flags().Changed("config") {
				return "", usageError("give --config or --file, not both")
			}
			if file == "" {
				return "", usageError("--file: empty path")
			}
			return file, nil
		}
		cfg, err := config.Load(configPath)
		if err != nil {
			return "", usageError("%v", err)
		}
		return cfg.Audit.Path, nil
	}

	verify := &cobra.Command{
		Use:   "verify [FILE...]",
		Short: "Check the audit log's hash chain and its .head sidecar",
		Long: `verify reads the whole audit log and checks that every line is a record whose
seq is its line number and whose prev is the SHA-256 of the line before it,
then that the file agrees with its .head sidecar. A log rotated by
[audit] max_size is followed across its moved-aside files, <log>.<seq>,
oldest first; verify names them, and says so when the oldest were pruned. It names the first line
where a line was edited, removed, inserted or reordered, or says that lines
were cut off the end.

Given FILEs (the logs of several replicas, each writing its own), it checks
each chain on its own and reports on each file.

Exit status: 0 when the log is intact, 1 when it is not, 2 when it cannot be
read.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				if cmd.Flags().Changed("file") || cmd.Flags().Changed("config") {
					return usageError("give FILEs, --config or --file, not several")
				}
				return verifyFiles(cmd.OutOrStdout(), args)
			}
			path, err := logPath(cmd)
			if err != nil {
				return err
			}
			rep, err := audit.VerifyFile(path)
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
				path, err := logPath(cmd)
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
	if !rep.Sidecar {
		fmt.Fprintf(out, "note: no %s.head sidecar, so lines cut off the end would go unseen\n", path)
	}
}

// verifyFiles checks each of several logs on its own (each replica writes
// its own chain) and reports on every one: exit 1 when any is broken, 2
// when any cannot be read and none is broken.
func verifyFiles(out io.Writer, paths []string) error {
	var broken, unreadable []string
	for _, path := range paths {
		rep, err := audit.VerifyFile(path)
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
