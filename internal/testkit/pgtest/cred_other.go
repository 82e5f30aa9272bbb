//go:build !unix

package pgtest

import "os/exec"

// asPostgres: no user switch off Unix.
func asPostgres(*exec.Cmd) (uid, gid int, err error) { return -1, -1, nil }
