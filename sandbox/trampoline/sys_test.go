//go:build linux

package trampoline

import (
	"testing"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// TestNumbersAreTheKernels: the numbers this package spells out itself
// (to do without x/sys/unix and go-landlock) are theirs.
func TestNumbersAreTheKernels(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"close_range", sysCloseRange, unix.SYS_CLOSE_RANGE},
		{"landlock_create_ruleset", sysLandlockCreateRuleset, unix.SYS_LANDLOCK_CREATE_RULESET},
		{"landlock_add_rule", sysLandlockAddRule, unix.SYS_LANDLOCK_ADD_RULE},
		{"landlock_restrict_self", sysLandlockRestrictSelf, unix.SYS_LANDLOCK_RESTRICT_SELF},
		{"seccomp", sysSeccomp, unix.SYS_SECCOMP},
		{"O_PATH", oPath, unix.O_PATH},
		{"PR_SET_PDEATHSIG", prSetPdeathsig, unix.PR_SET_PDEATHSIG},
		{"PR_SET_NAME", prSetName, unix.PR_SET_NAME},
		{"PR_CAPBSET_DROP", prCapbsetDrop, unix.PR_CAPBSET_DROP},
		{"PR_SET_NO_NEW_PRIVS", prSetNoNewPrivs, unix.PR_SET_NO_NEW_PRIVS},
		{"PR_CAP_AMBIENT", prCapAmbient, unix.PR_CAP_AMBIENT},
		{"PR_CAP_AMBIENT_CLEAR_ALL", prCapAmbientClearAll, unix.PR_CAP_AMBIENT_CLEAR_ALL},
		{"CAP_SETPCAP", capSetpcap, unix.CAP_SETPCAP},
		{"_LINUX_CAPABILITY_VERSION_3", linuxCapabilityV3, unix.LINUX_CAPABILITY_VERSION_3},
		{"CLOSE_RANGE_CLOEXEC", closeRangeCloexec, unix.CLOSE_RANGE_CLOEXEC},
		{"SECCOMP_SET_MODE_FILTER", seccompSetModeFilter, unix.SECCOMP_SET_MODE_FILTER},
		{"SECCOMP_FILTER_FLAG_NEW_LISTENER", seccompNewListener, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER},
		{"SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV", seccompWaitKillableRecv, unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV},
		{"LANDLOCK_RULE_PATH_BENEATH", landlockRulePathBeneath, unix.LANDLOCK_RULE_PATH_BENEATH},
		{"POLLIN", pollIn, unix.POLLIN},
		{"execute", llExecute, llsys.AccessFSExecute},
		{"write_file", llWriteFile, llsys.AccessFSWriteFile},
		{"read_file", llReadFile, llsys.AccessFSReadFile},
		{"read_dir", llReadDir, llsys.AccessFSReadDir},
		{"remove_dir", llRemoveDir, llsys.AccessFSRemoveDir},
		{"remove_file", llRemoveFile, llsys.AccessFSRemoveFile},
		{"make_char", llMakeChar, llsys.AccessFSMakeChar},
		{"make_dir", llMakeDir, llsys.AccessFSMakeDir},
		{"make_reg", llMakeReg, llsys.AccessFSMakeReg},
		{"make_sock", llMakeSock, llsys.AccessFSMakeSock},
		{"make_fifo", llMakeFifo, llsys.AccessFSMakeFifo},
		{"make_block", llMakeBlock, llsys.AccessFSMakeBlock},
		{"make_sym", llMakeSym, llsys.AccessFSMakeSym},
		{"refer", llRefer, llsys.AccessFSRefer},
		{"truncate", llTruncate, llsys.AccessFSTruncate},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#x here, %#x in the kernel's headers", c.name, c.got, c.want)
		}
	}
	// go-landlock's RODirs, RWDirs, ROFiles and RWFiles grant these.
	read := uint64(llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir)
	write := uint64(llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile | llsys.AccessFSMakeChar |
		llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock | llsys.AccessFSMakeFifo |
		llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSTruncate)
	file := uint64(llsys.AccessFSExecute | llsys.AccessFSWriteFile | llsys.AccessFSTruncate | llsys.AccessFSReadFile)
	if accessRead != read || accessWrite != write || accessFile != file {
		t.Errorf("access sets %#x %#x %#x, go-landlock's %#x %#x %#x", accessRead, accessWrite, accessFile, read, write, file)
	}
}
