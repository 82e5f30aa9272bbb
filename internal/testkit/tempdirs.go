package testkit

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

var (
	tempRootMu sync.Mutex
	tempRoot   string
)

// QuietTempDirs puts the package's test temp dirs (t.TempDir, which takes
// its parent from $GOTMPDIR) in a directory of their own beside /tmp, for
// a package whose tests start sandboxed tools from capgate serve: every
// launch carves capgate's deny paths (its data dir and config, in a test's
// temp dir) out of the tool's Landlock rules, which lists, resolves and
// gives a rule to every entry of each directory above them. In a shared
// /tmp that is hundreds of entries per launch; a production data_dir
// (/var/lib/capgate) has a few. Machine-wide caches ($TMPDIR/capgate-*)
// stay where they are. The name is short: a Unix socket path in a test's
// temp dir must stay under 108 bytes. Call it in TestMain before Main;
// Cleanup removes the directory. It does nothing where /var/tmp cannot
// be used or $GOTMPDIR is set already.
func QuietTempDirs() {
	tempRootMu.Lock()
	defer tempRootMu.Unlock()
	if tempRoot != "" || os.Getenv("GOTMPDIR") != "" {
		return
	}
	// /var/tmp/cg<pid>: at most 18 bytes, like /tmp's 4 plus a test's name.
	d := filepath.Join("/var/tmp", "cg"+strconv.Itoa(os.Getpid()))
	os.RemoveAll(d) // a dead process's, whose pid this one got
	if os.Mkdir(d, 0o755) != nil {
		return
	}
	// Tools run as another user (run_as) and serve as one (Capgate.User)
	// must reach the test dirs below it.
	if os.Chmod(d, 0o755) != nil || os.Setenv("GOTMPDIR", d) != nil {
		os.Remove(d)
		return
	}
	tempRoot = d
}

// removeTempRoot removes what QuietTempDirs made.
func removeTempRoot() {
	tempRootMu.Lock()
	defer tempRootMu.Unlock()
	if tempRoot != "" {
		os.RemoveAll(tempRoot)
		os.Unsetenv("GOTMPDIR")
		tempRoot = ""
	}
}
