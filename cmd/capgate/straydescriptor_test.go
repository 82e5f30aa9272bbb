//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// TestToolGetsNoStrayDescriptor: a descriptor capgate was started with but
// never opened itself (a supervisor's leak, a shell's `exec 7<file`)
// reaches no tool. Through it a tool would read what Landlock keeps from
// it, since Landlock checks a file when it is opened, not when it is read.
func TestToolGetsNoStrayDescriptor(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	secret := filepath.Join(t.TempDir(), "stray.txt")
	writeFile(t, secret, "stray-descriptor-secret")
	if err := os.Chmod(secret, 0o600); err != nil { // not for the tool's user to open
		t.Fatal(err)
	}
	pack := filepath.Join(t.TempDir(), "leak")
	hostile := testkit.Build(t, "github.com/capgate/capgate/internal/testkit/hostile")
	writeFile(t, filepath.Join(pack, "extension.yaml"), fmt.Sprintf(
		"id: leak\nname: Leak\ndescription: Reads descriptor 7\ncommands:\n  read:\n    description: Read descriptor 7\n"+
			"    run: [%q, \"--json\", \"fd=7\", \"read=%s\"]\n    risk: LOW\n    side_effects: []\n", hostile, secret))
	cg := testkit.StartCapgate(t, testkit.Capgate{
		// serve starts with the secret open on descriptor 7, not close-on-exec.
		Wrap:   []string{"/bin/sh", "-c", `exec 7<"$0" && exec "$@"`, secret},
		Config: fmt.Sprintf("[policy]\ngrants = [\"rye.execute.tool.*\"]\nacknowledge = [\"elevated\"]\n\n[extensions]\npaths = [%q]\n", filepath.Dir(pack)),
	})
	s := fromCapgate(cg)
	out := invoker(t, s, s.mint(t, "alice", "private"))("ext:leak:read")
	if strings.Contains(out, "stray-descriptor-secret") {
		t.Fatalf("the tool read the secret through capgate's stray descriptor 7:\n%s", out)
	}
	// Both attempts ran: the descriptor was closed, and the file itself
	// the tool may not open (when it can, as root, the test proves less).
	if !strings.Contains(out, `"fd=7": "denied`) || !strings.Contains(out, "bad file descriptor") {
		t.Fatalf("the tool's attempt on descriptor 7 did not report a closed descriptor:\n%s", out)
	}
	if !strings.Contains(out, `.txt": "denied`) {
		t.Errorf("the tool could open the secret file itself:\n%s", out)
	}
}
