//go:build unix

package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// asPostgres makes cmd run as the postgres user when this process is
// root (initdb and postgres refuse root), and returns that user's ids for
// chown; -1 when no switch is needed.
func asPostgres(cmd *exec.Cmd) (uid, gid int, err error) {
	if cmd != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		dieWithParent(cmd.SysProcAttr)
	}
	if os.Geteuid() != 0 {
		return -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, fmt.Errorf("running as root and no postgres user to run PostgreSQL as: %w", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	if cmd != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return uid, gid, nil
}
