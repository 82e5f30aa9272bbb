package testkit

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// HostPID (Linux: it reads /proc; elsewhere 0) is this machine's pid for the process a tool knows as nspid, the
// pid in its own PID namespace (a sandboxed tool sees only its namespace's
// /proc), among the descendants of ancestors; 0 when there is none. A
// process in no namespace of its own is its own nspid.
func HostPID(nspid int, ancestors ...int) int {
	return HostPIDRunning(nspid, "", ancestors...)
}

// HostPIDRunning is HostPID among the processes whose command line holds
// arg: each sandboxed process may be pid 2 of its own namespace, so where
// several run under ancestors (a replica's MCP server beside a tool), the
// namespace pid alone can name the wrong one.
func HostPIDRunning(nspid int, arg string, ancestors ...int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	want := strconv.Itoa(nspid)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns := statusField(pid, "NSpid:"); len(ns) == 0 || ns[len(ns)-1] != want || !descends(pid, ancestors) {
			continue
		}
		if cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(cmdline), arg) {
			return pid
		}
	}
	return 0
}

// descends reports whether pid's chain of parents meets one of ancestors.
func descends(pid int, ancestors []int) bool {
	for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
		if slices.Contains(ancestors, p) {
			return true
		}
		pp := statusField(p, "PPid:")
		if len(pp) != 1 {
			return false
		}
		p, _ = strconv.Atoi(pp[0])
	}
	return false
}

// statusField is the words of a line of /proc/<pid>/status.
func statusField(pid int, name string) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}
