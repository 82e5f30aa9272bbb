//go:build !linux

package proc

import (
	"errors"
	"os"
	"os/exec"
)

// Start starts cmd.
func Start(cmd *exec.Cmd) error { return cmd.Start() }

// HardenSelf does nothing off Linux.
func HardenSelf() error { return nil }

// MemFile is unsupported here: the input goes through a pipe.
func MemFile(string, []byte) (*os.File, error) { return nil, errors.ErrUnsupported }
