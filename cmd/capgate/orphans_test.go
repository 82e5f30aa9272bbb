//go:build linux

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/token"
	"golang.org/x/sys/unix"
)

// TestToolChildrenDieWithCapgate (issue 30 item 1): a tool forks a
// grandchild into a session of its own (out of the tool's process group,
// as a daemon would), which is to write a side effect two seconds later;
// capgate serve is killed with SIGKILL mid-call. The grandchild dies with
// it and the side effect never happens: the tool's PID namespace ends
// when its init, tied to capgate by the parent-death signal, does. As
// root (tools run as root without capabilities) and with serve itself unprivileged (the
// namespace inside a user namespace).
func TestToolChildrenDieWithCapgate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	t.Run("root", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("needs root")
		}
		orphans(t, nil)
	})
	t.Run("unprivileged", func(t *testing.T) {
		if !sandbox.Probe().UserNS {
			t.Skip("this kernel refuses unprivileged user namespaces")
		}
		orphans(t, unprivileged())
	})
}

func orphans(t *testing.T, user *testkit.User) {
	// A tool runs as root without capabilities or as serve's user: out
	// is writable by all.
	dir, packs, out := publicDir(t, user), publicDir(t, nil), publicDir(t, nil)
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	// Pids in the tool's PID namespace, which testkit.HostPID maps to this
	// machine's.
	script := `#!/bin/sh
out=$1
setsid sh -c 'read -r me _ < /proc/self/stat; echo "$me" > "$1/grandchild.pid"; sleep 2; echo late > "$1/effect"; exec sleep 600' sh "$out" </dev/null >/dev/null 2>&1 &
while [ ! -s "$out/grandchild.pid" ]; do sleep 0.01; done
read -r me _ < /proc/self/stat
echo "$me" > "$out/tool.pid"
sleep 600
`
	writeFile(t, filepath.Join(packs, "daemon", "bin", "run"), script)
	if err := os.Chmod(filepath.Join(packs, "daemon", "bin", "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(packs, "daemon", "extension.yaml"), fmt.Sprintf(`id: daemon
name: Daemon
description: A command whose child outlives it unless something ends it
commands:
  spawn:
    description: Start a grandchild that writes a file later, then wait
    run: ["./bin/run", %q]
    input_schema: {type: object}
    risk: LOW
    timeout: 10m
`, out))
	cg := testkit.StartCapgate(t, testkit.Capgate{User: user, Dir: dir, Config: fmt.Sprintf(`
[extensions]
paths = [%q]

[policy]
grants = ["rye.execute.tool.ext.daemon.*"]
`, packs)})
	tok := cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})
	answer := make(chan keyAnswer, 1)
	go func() {
		answer <- keyedCall(&http.Client{Timeout: time.Minute}, cg.Addr, tok, "ext:daemon:spawn", `{}`, "daemon-1")
	}()
	pidIn := func(name string) int {
		b, _ := os.ReadFile(filepath.Join(out, name))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	var tool, grandchild int
	testkit.WaitFor(t, 20*time.Second, "the tool and its grandchild to start", func() bool {
		select {
		case a := <-answer:
			t.Fatalf("the call ended before capgate was killed: %+v\n%s", a, cg.Logs())
		default:
		}
		tool, grandchild = pidIn("tool.pid"), pidIn("grandchild.pid")
		if tool == 0 || grandchild == 0 {
			return false
		}
		tool, grandchild = testkit.HostPID(tool, cg.Cmd.Process.Pid), testkit.HostPID(grandchild, cg.Cmd.Process.Pid)
		return tool != 0 && grandchild != 0
	})
	// Should the fix be missing, the test leaves nothing running.
	t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
	if processGone(grandchild) || processGone(tool) {
		t.Fatalf("the tool (%d) or its grandchild (%d) ended before capgate was killed", tool, grandchild)
	}
	if sid, _ := unix.Getsid(grandchild); sid != grandchild {
		t.Fatalf("the grandchild %d is not in a session of its own (sid %d): the test proves less", grandchild, sid)
	}
	killed := time.Now()
	if err := cg.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cg.Cmd.Wait()
	for what, pid := range map[string]int{"tool": tool, "grandchild": grandchild} {
		if !testkit.Poll(10*time.Second, func() bool { return processGone(pid) }) {
			t.Errorf("the %s (pid %d) outlived capgate by 10 s", what, pid)
			continue
		}
		t.Logf("the %s (pid %d) was gone %v after capgate's SIGKILL", what, pid, time.Since(killed).Round(time.Millisecond))
	}
	if b, err := os.ReadFile(filepath.Join(out, "effect")); err == nil {
		t.Errorf("the grandchild wrote its side effect after capgate died: %q", b)
	}
}
