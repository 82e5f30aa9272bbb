package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/audit"
)

// auditLog writes a log of n events and returns its path and lines.
func auditLog(t *testing.T, dir string, n int) (string, []string) {
	t.Helper()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := audit.Open(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		l.Log(audit.Event{Type: audit.TypeGrantCheck, Required: "rye.execute.tool.mcp.fs.read", Sub: "user-1",
			Tool: "mcp:fs:read", Decision: "deny", Duration: time.Millisecond, RequestID: fmt.Sprint("req-", i)})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
}

// auditRegistered reports whether newRootCmd has the audit command.
func auditRegistered() bool {
	c, _, err := newRootCmd().Find([]string{"audit", "verify"})
	return err == nil && c.Parent() != nil && c.Parent().Name() == "audit"
}

func TestAuditRegistered(t *testing.T) {
	if !auditRegistered() {
		t.Fatal("newAuditCmd() is not registered in newRootCmd (main.go); the other TestAudit tests skip until it is")
	}
}

func auditRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if !auditRegistered() {
		t.Skip("newAuditCmd() is not registered in newRootCmd; see TestAuditRegistered")
	}
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestAuditVerify(t *testing.T) {
	path, lines := auditLog(t, t.TempDir(), 5)
	rep, err := audit.VerifyFile(path)
	if err != nil {
		t.Fatal(err)
	}

	code, out, errs := auditRun(t, "audit", "verify", "--file", path)
	if want := fmt.Sprintf("%s: 5 lines, chain intact (head %s)\nnote: checked without capgate's key, so a log cut back with its .head rewritten would pass\n", path, rep.Head); code != 0 || out != want || errs != "" {
		t.Errorf("intact log: exit %d\nstdout %q\nwant   %q\nstderr %q", code, out, want, errs)
	}

	// Line 2 edited: line 3's prev no longer matches.
	edited := strings.Replace(lines[1], `"sub":"user-1"`, `"sub":"user-2"`, 1)
	if edited == lines[1] {
		t.Fatal("test edit did not apply")
	}
	data := strings.Join(lines[:1], "") + edited + strings.Join(lines[2:], "") + "\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = auditRun(t, "audit", "verify", "--file", path)
	want := "capgate: " + path + ": line 3: prev does not match line 2's hash: line 2 was edited, or a line was removed, inserted or reordered\n"
	if code != 1 || out != "" || errs != want {
		t.Errorf("edited log: exit %d\nstdout %q\nstderr %q\nwant   %q", code, out, errs, want)
	}
}

func TestAuditVerifyTruncatedAndNoSidecar(t *testing.T) {
	path, lines := auditLog(t, t.TempDir(), 4)
	if err := os.WriteFile(path, []byte(strings.Join(lines[:3], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := auditRun(t, "audit", "verify", "--file", path)
	if want := "capgate: " + path + ": truncated: audit.jsonl.head records 4 lines but the file has 3: line 4 and after were removed\n"; code != 1 || errs != want {
		t.Errorf("truncated log: exit %d, stderr %q, want %q", code, errs, want)
	}
	if err := os.Remove(path + ".head"); err != nil {
		t.Fatal(err)
	}
	code, out, _ := auditRun(t, "audit", "verify", "--file", path)
	if code != 0 || !strings.Contains(out, ": 3 lines, chain intact") || !strings.Contains(out, "note: no "+path+".head sidecar") {
		t.Errorf("without sidecar: exit %d, stdout %q", code, out)
	}
}

func TestAuditConfig(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	path, _ := auditLog(t, logs, 3)
	cfg := filepath.Join(dir, "capgate.toml")
	if err := os.WriteFile(cfg, []byte("[audit]\npath = \"logs/audit.jsonl\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := auditRun(t, "audit", "verify", "--config", cfg)
	if code != 0 || !strings.HasPrefix(out, path+": 3 lines, chain intact (head ") {
		t.Errorf("--config: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = auditRun(t, "audit", "tail", "--config", cfg, "-n", "1")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"seq":3,`) {
		t.Errorf("tail --config: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestAuditTail(t *testing.T) {
	path, lines := auditLog(t, t.TempDir(), 30)
	code, out, _ := auditRun(t, "audit", "tail", "--file", path, "-n", "2")
	if want := lines[28] + lines[29] + "\n"; code != 0 || out != want {
		t.Errorf("tail -n 2: exit %d\n%q\nwant\n%q", code, out, want)
	}
	code, out, _ = auditRun(t, "audit", "tail", "--file", path)
	if code != 0 || strings.Count(out, "\n") != 20 || !strings.HasPrefix(out, lines[10]) {
		t.Errorf("tail (default 20): exit %d, %d lines", code, strings.Count(out, "\n"))
	}
}

func TestAuditUsage(t *testing.T) {
	dir := t.TempDir()
	path, _ := auditLog(t, dir, 1)
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"audit", "verify", "--file", path, "--config", "x.toml"}, "give --config or --file, not both"},
		{[]string{"audit", "verify", "--file", filepath.Join(dir, "nope.jsonl")}, "no such file"},
		{[]string{"audit", "verify", "--config", filepath.Join(dir, "nope.toml")}, "nope.toml"},
		{[]string{"audit", "tail", "--file", path, "-n", "-1"}, "-n -1: want 0 or more lines"},
		{[]string{"audit", "tail", "--file", filepath.Join(dir, "nope.jsonl")}, "no such file"},
		{[]string{"audit", "verify", "extra"}, "extra: no such file"},
	} {
		code, _, errs := auditRun(t, tt.args...)
		if code != 2 || !strings.Contains(errs, tt.stderr) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tt.args, code, errs, tt.stderr)
		}
	}
}

// TestAuditVerifySeveral: verify given the logs of two replicas checks
// each chain on its own; a line edited in one is reported naming that file
// and line, and the other is still reported intact.
func TestAuditVerifySeveral(t *testing.T) {
	a, _ := auditLog(t, t.TempDir(), 4)
	b, lines := auditLog(t, t.TempDir(), 4)
	code, out, errs := auditRun(t, "audit", "verify", a, b)
	if code != 0 || !strings.Contains(out, a+": 4 lines, chain intact") || !strings.Contains(out, b+": 4 lines, chain intact") {
		t.Fatalf("two intact logs: exit %d\n%s%s", code, out, errs)
	}
	lines[2] = strings.Replace(lines[2], `"sub":"user-1"`, `"sub":"user-2"`, 1)
	if err := os.WriteFile(b, []byte(strings.Join(lines, "")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = auditRun(t, "audit", "verify", a, b)
	if code != 1 || !strings.Contains(out, a+": 4 lines, chain intact") || !strings.Contains(out, b+": BROKEN: "+b+": line 4") ||
		!strings.Contains(errs, "1 of 2 logs") {
		t.Errorf("one edited log: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := auditRun(t, "audit", "verify", a, filepath.Join(t.TempDir(), "nope.jsonl")); code != 2 || !strings.Contains(errs, "cannot be read") {
		t.Errorf("a missing log: exit %d %s", code, errs)
	}
	if code, _, errs := auditRun(t, "audit", "verify", "--file", a, b); code != 2 || !strings.Contains(errs, "not several") {
		t.Errorf("FILEs and --file: exit %d %s", code, errs)
	}
}
