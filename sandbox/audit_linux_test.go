//go:build linux

package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// TestAuditRecordsReachTheirLaunch: Landlock's records, as the kernel
// writes them (an access before its domain's record, a path in hex), reach
// the Denials of the launch whose tag the domain's maker took, and the
// error names the file and the declaration that would allow it.
func TestAuditRecordsReachTheirLaunch(t *testing.T) {
	w := &auditWatch{tags: map[string]*tagged{}, domains: map[string]*tagged{}, pending: map[string][]FileDenial{}}
	var d, other Denials
	w.tags["cg0011223344aa"] = &tagged{d: &d, done: make(chan struct{})}
	for _, r := range []struct {
		typ  uint16
		text string
	}{
		{auditLandlockAccess, `audit(1.5:26): domain=1b9 blockers=fs.read_file path="/sys/kernel/mm/transparent_hugepage/hpage_pmd_size" dev="sysfs" ino=3819`},
		{auditLandlockDomain, `audit(1.5:26): domain=1b9 status=allocated mode=enforcing pid=25896 uid=0 exe="/usr/bin/capgate" comm="cg0011223344aa"`},
		{auditLandlockAccess, `audit(1.6:27): domain=1b9 blockers=fs.write_file path=2F7372762F6F7574206469722F78 dev="vda" ino=1`},
		{auditLandlockAccess, `audit(1.6:28): domain=2c0 blockers=fs.read_file path="/etc/shadow" dev="vda" ino=2`},
		{auditLandlockDomain, `audit(1.7:29): domain=1b9 status=deallocated denials=2`},
	} {
		w.record(r.typ, r.text)
	}
	g, _ := Derive(Declared{Filesystem: "read"}, Overrides{}, Declared{})
	msg, hint := d.Explain(g, "bridge:gog", "capabilities of [capabilities.providers.gog]")
	if msg != "the kernel refused it writing /srv/out dir/x (fs.write_file)" ||
		hint != `declare filesystem: write with write_paths: ["/srv/out dir"] in capabilities of [capabilities.providers.gog]` {
		t.Errorf("msg %q\nhint %q", msg, hint)
	}
	if msg, _ := other.Explain(g, "", ""); msg != "" || strings.Contains(msg, "shadow") {
		t.Errorf("another domain's denial reached a launch: %q", msg)
	}
}

// TestStderrReportsCheckedAgainstRules: the usual shapes of a refusal in
// a tool's stderr name a path only when the launch's rules refuse it; a
// path its rules allow (a refusal by file modes) and a path shaped like a
// credential name nothing; a path is named whether it exists or not (capgate
// must not tell which host paths exist); the message says it is the tool's
// report.
func TestStderrReportsCheckedAgainstRules(t *testing.T) {
	root := t.TempDir()
	ro, rw, out := filepath.Join(root, "ro"), filepath.Join(root, "rw"), filepath.Join(root, "out dir")
	for _, d := range []string{ro, rw, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(out, "secret")
	if err := os.WriteFile(secret, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &rules{readDirs: []string{"/usr", ro}, writeDirs: []string{rw}}
	g, _ := Derive(Declared{Filesystem: "read"}, Overrides{}, Declared{})
	for _, c := range []struct{ stderr, want string }{
		{"open " + secret + ": permission denied", secret + ", which its sandbox does not let it read"},
		{"read=" + secret + " denied open " + secret + ": permission denied", secret + ", which its sandbox does not let it read"},
		{"PermissionError: [Errno 13] Permission denied: '" + secret + "'", secret + ", which its sandbox does not let it read"},
		{"Error: EACCES: permission denied, open '" + secret + "'", secret + ", which its sandbox does not let it read"},
		{"/bin/sh: 1: cannot create " + ro + "/new: Permission denied", ro + "/new, which its sandbox lets it read but not write"},
		{"java.io.FileNotFoundException: " + secret + " (Permission denied)", secret + ", which its sandbox does not let it read"},
		{"open " + rw + "/x: permission denied", ""},                                                                 // allowed by the rules: file modes refused it
		{"open /nonexistent/dir/x: permission denied", "/nonexistent/dir/x, which its sandbox does not let it read"}, // named alike whether it exists: no oracle
		{"open " + secret + ": no such file or directory", ""},                                                       // not a refusal
		{"open " + filepath.Join(out, "sk_live_0123456789abcdefghijklmn") + ": permission denied", ""},               // shaped like a credential: never named
	} {
		d := Denials{rules: r}
		d.Stderr(c.stderr)
		msg, hint := d.Explain(g, "ext:p:c", "capabilities")
		switch {
		case c.want == "" && msg != "":
			t.Errorf("%q named %q", c.stderr, msg)
		case c.want != "" && (!strings.Contains(msg, "its stderr reports a refused access to "+c.want) || strings.Contains(msg, "the kernel refused") ||
			!strings.Contains(hint, filepath.Dir(c.want[:strings.Index(c.want, ",")]))):
			t.Errorf("%q: msg %q hint %q", c.stderr, msg, hint)
		}
	}
	// Where capgate read the launch's audit records, the tool's word is
	// not needed.
	d := Denials{rules: r, audited: true}
	d.Stderr("open " + secret + ": permission denied")
	if msg, _ := d.Explain(g, "", ""); msg != "" {
		t.Errorf("an audited launch took the stderr's word: %q", msg)
	}
}

// BenchmarkSettleAudit measures what a failed call to a stdio MCP server
// waits for its audit records (root, kernel audit on): one marker queued
// behind them and read back. It fails if the marker does not arrive.
func BenchmarkSettleAudit(b *testing.B) {
	if os.Getuid() != 0 || Probe().LandlockABI < 7 {
		b.Skip("reading kernel audit needs root and Landlock ABI 7")
	}
	testkit.ShareKernelAudit(b, KernelAuditOn, SetKernelAudit)
	if err := WatchFileDenials(true); err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if !SettleAudit(5 * time.Second) {
			b.Fatal("the marker did not come back")
		}
	}
}

// TestLateRecordsStillNamed: the records of a launch's denials reach
// capgate late when its audit reader lags (a loaded machine): a call's
// error still names the file, since the launch's settle waits for a marker
// queued behind the records rather than a fixed while. Here the reader is
// held for 600 ms after the tool exits; the fixed 300 ms wait it replaced
// named nothing.
func TestLateRecordsStillNamed(t *testing.T) {
	f := Probe()
	if os.Getuid() != 0 || f.LandlockABI < 7 {
		t.Skip("reading kernel audit needs root and Landlock ABI 7")
	}
	testkit.ShareKernelAudit(t, KernelAuditOn, SetKernelAudit)
	if err := WatchFileDenials(true); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	d := &Denials{}
	spec := Spec{Path: w.tool, Args: []string{"read=" + w.key}, Dir: w.work, Deny: []string{w.data}, Files: d}
	cmd, cleanup, err := command(spec, f)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	// The reader stops at the launch's first record until 600 ms after
	// the tool exits.
	release := make(chan struct{})
	lag := func() { <-release }
	readLag.Store(&lag)
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer func() { readLag.Store(nil); let() }()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "denied") {
		t.Fatalf("the tool: %v, %s; want its read refused", err, out)
	}
	time.AfterFunc(600*time.Millisecond, let)
	g, _ := Derive(Declared{Filesystem: "read"}, Overrides{}, Declared{})
	msg, _ := d.Explain(g, "ext:p:c", "capabilities")
	if want := "the kernel refused it reading " + w.key + " (fs.read_file)"; !strings.Contains(msg, want) {
		t.Errorf("the error says %q, want %q", msg, want)
	}
}
