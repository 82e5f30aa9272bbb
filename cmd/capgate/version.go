package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print capgate's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), versionLine())
		},
	}
}

// versionLine is what `capgate version` and `capgate --version` print.
func versionLine() string {
	return fmt.Sprintf("capgate %s %s %s/%s\n", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// version is the -ldflags version, else the module version `go install`
// recorded, else "dev".
func version() string {
	if capgate.Version != "dev" {
		return capgate.Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return capgate.Version
}
