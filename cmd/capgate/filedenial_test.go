//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
)

// TestFileDenialIsNamedAsRoot: a bridge provider declaring filesystem
// read tries a file outside its read paths and gives up (exit 254); a root
// serve reads Landlock's audit records, so the caller's error names the
// access and the path, and the hint the declaration that would allow it.
func TestFileDenialIsNamedAsRoot(t *testing.T) {
	needKernelAudit(t, "TestFileDenialUnprivileged")
	out, _ := fileDenial(t, nil)
	for _, want := range []string{"command failed with exit 254", "the kernel refused it reading ", "(fs.read_file)",
		"to allow it: add ", " to read_paths in capabilities of [capabilities.providers.gog]"} {
		if !strings.Contains(out, want) {
			t.Errorf("the caller's error lacks %q:\n%s", want, out)
		}
	}
}

// needKernelAudit skips t unless serve can read Landlock's audit records
// here (root, ABI 7, audit readable; otherwise, unprivileged covers this
// user), and has kernel audit turned off again, if it was off, once no
// test process here uses it.
func needKernelAudit(t *testing.T, unprivileged string) {
	if os.Getuid() != 0 {
		t.Skip("reading kernel audit needs root; " + unprivileged + " covers this user")
	}
	if sandbox.Probe().LandlockABI < 7 {
		t.Skip("Landlock ABI 7 logs denials; this kernel's does not")
	}
	testkit.ShareKernelAudit(t, sandbox.KernelAuditOn, sandbox.SetKernelAudit)
}

// TestFileDenialUnprivileged: an unprivileged serve cannot read audit:
// it says so at start, and the call's error names the file the provider's
// stderr reports refused, checked against its sandbox rules and labelled
// as the tool's report, with the declaration that would allow it; nothing
// else of the stderr reaches the caller.
func TestFileDenialUnprivileged(t *testing.T) {
	user := unprivileged()
	out, secret := fileDenial(t, user)
	for _, want := range []string{"command failed with exit 254", "its stderr reports a refused access to " + secret + ", which its sandbox does not let it read",
		fmt.Sprintf("to allow it: add %q to read_paths in capabilities of [capabilities.providers.gog]", filepath.Dir(secret))} {
		if !strings.Contains(out, want) {
			t.Errorf("the caller's error lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "the kernel refused it reading") || strings.Contains(out, "read="+secret) {
		t.Errorf("the unprivileged call's error claims the kernel's word or carries the stderr: %s", out)
	}
}

// fileDenial serves a provider that reads a file it may not and returns
// the call's error and the file.
func fileDenial(t *testing.T, user *testkit.User) (string, string) {
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	if f := sandbox.Probe(); f.LandlockABI < 1 || (user != nil && !f.UserNS) {
		t.Skipf("this kernel cannot enforce filesystem guarantees here: %+v", f)
	}
	other := publicDir(t, nil)
	secret := filepath.Join(other, "secret")
	writeFile(t, secret, "never")
	cg := testkit.StartCapgate(t, testkit.Capgate{User: user, Dir: publicDir(t, user), Config: fmt.Sprintf(
		"[sandbox]\naudit_file_denials = true\n\n[policy]\ngrants = [\"rye.fetch.*\", \"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[capabilities.providers.gog]\ncommand = [%q]\ncapabilities = { filesystem = \"read\" }\n",
		testkit.Build(t, testkit.BridgeFixture))})
	s := fromCapgate(cg)
	stdout, errb, code := s.as(t, cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"}), "invoke", "--capability", "gog.calendar",
		"--operation", "list_events", "--input-json", fmt.Sprintf(`{"attempt_or_fail":%q}`, "read="+secret))
	t.Logf("%s", errb)
	if code == 0 {
		t.Fatalf("the provider read %s: %s", secret, stdout)
	}
	if user != nil && !strings.Contains(s.logs(), `msg="file denials are named from what the tool's stderr reports, checked against its sandbox rules, not from the kernel's records" why="reading kernel audit needs root"`) {
		t.Errorf("an unprivileged serve did not say how file denials are named:\n%s", s.logs())
	}
	return errb, secret
}
