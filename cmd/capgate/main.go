// Command capgate is the capgate CLI. Each command group lives in its own
// file; this one wires them and maps errors to exit codes.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/internal/proc"
	"github.com/spf13/cobra"
)

func main() {
	trampoline()
	// No process of capgate's user may read its memory or its
	// /proc/<pid>/environ; its secrets may come from files instead.
	_ = proc.HardenSelf()
	if err := app.SecretFiles(app.SecretNames, os.LookupEnv, os.Setenv, os.Unsetenv); err != nil {
		fmt.Fprintln(os.Stderr, "capgate:", err)
		os.Exit(exitUsage)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes shared by every command.
const (
	exitOK     = 0
	exitDenied = 1 // a decision was made and it is "no"
	exitUsage  = 2 // bad input: flags, arguments, files
)

// exitError carries an exit code out of a command. With a nil err the
// command has already said everything.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// run executes the CLI with args and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	code := exitUsage // cobra's own errors: unknown flags, commands, argument counts
	var ee *exitError
	if errors.As(err, &ee) {
		code, err = ee.code, ee.err
	}
	if err == nil {
		return code // the command has said everything
	}
	if jsonOutput(cmd) || jsonAsked(args) {
		writeJSONError(stderr, code, err)
		return code
	}
	fmt.Fprintln(stderr, "capgate:", err)
	return code
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "capgate",
		Short: "capgate: a capability router and MCP tool server",
		Long: `capgate merges tools from extension packs, bridge-v1 providers and upstream
MCP servers into one catalog, and decides for every call whether the verified
caller may make it, by Rye-style capability strings (rye.execute.tool.*).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Version(),
	}
	// --version prints what `capgate version` prints.
	root.SetVersionTemplate(buildinfo.Get().String())
	root.AddCommand(newVersionCmd(), newConfigCmd(), newCheckCmd(), newPermsCmd(), newToolsCmd(), newTokenCmd(),
		newServeCmd(), newConnectCmd(), newCapabilityCmd(), newApproveCmd(), newApprovalsCmd(), newAuditCmd(), newBenchCmd(), newSkillCmd(),
		newVerifyCmd(), newReloadCmd(), newConsoleCmd(), newAccountsCmd())
	return root
}
