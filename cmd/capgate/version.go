package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/internal/buildinfo"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print capgate's version, VCS revision and Go version, as the build recorded them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(buildinfo.Get())
			}
			fmt.Fprint(cmd.OutOrStdout(), buildinfo.Get().String())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
