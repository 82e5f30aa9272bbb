//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// TestNotifyRecordsBeforeRefusing: a socket the kernel hands capgate
// under no_network is recorded before the tool sees it refused, however
// slow the record (here 200 ms, as on a loaded machine): the tool's line
// saying its connect was denied, read as it comes, never precedes the
// observer's record, so a call's result cannot miss the denial that
// failed it. And the tool, a Go program blocked in socket() all that
// while, still finishes: its runtime signals the thread (the syscall is a
// raw one, so sysmon preempts it with SIGURG after 10 ms), which, were the
// wait interruptible, would restart the syscall and notify it anew for as
// long as each record outlasts the signals. Through both trampolines.
func TestNotifyRecordsBeforeRefusing(t *testing.T) {
	t.Run("C", func(t *testing.T) { notifyRecordsBeforeRefusing(t, "") })
	t.Run("Go", func(t *testing.T) { notifyRecordsBeforeRefusing(t, goTrampoline(t, t.TempDir())) })
}

func notifyRecordsBeforeRefusing(t *testing.T, tramp string) {
	f := Probe()
	g := guarantee(NoNetwork)
	needs(t, f, g)
	w := newWorld(t)
	var recorded, observed atomic.Int32
	spec := Spec{Path: w.tool, Args: []string{"tcp=" + w.tcp, "id"}, Dir: w.work, Guarantees: g,
		Trampoline: tramp, Observe: func(k Key) {
			observed.Add(1)
			// The slow record of a loaded machine: a cost to wait out,
			// not a wait for something.
			time.Sleep(200 * time.Millisecond)
			if k == NoNetwork {
				recorded.Add(1)
			}
		}}
	cmd, cleanup, err := command(spec, f)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			lines = append(lines, line)
			if strings.HasPrefix(line, "tcp=") && recorded.Load() == 0 {
				t.Errorf("the tool saw its socket refused before capgate recorded it: %q", line)
			}
		}
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "tcp="+w.tcp+" denied") || lines[1] != "id ok uid="+strconv.Itoa(os.Getuid()) {
			t.Errorf("the tool's lines: %q, want its connect denied and its id after it", lines)
		}
		done <- cmd.Wait()
	}()
	// A deadline for a tool that never ends, not a measure: it takes
	// about the one slow record.
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the tool: %v", err)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the tool never finished: its socket() was notified %d times while the record was slow", observed.Load())
	}
	if n := observed.Load(); n != 1 {
		t.Errorf("the socket was notified %d times, want once", n)
	}
}

// oldKernelEnv makes launchFromEnv a capgate on a kernel before 5.19, as
// far as the trampoline can tell: a seccomp filter of its own answers
// EINVAL to a filter loaded with WAIT_KILLABLE_RECV, as such a kernel
// does. Its observer writes "observed KEY" to its stdout, the tool's,
// once per guarantee.
const oldKernelEnv = "CAPGATE_SANDBOX_TEST_OLD_KERNEL"

// asOldKernel is launchFromEnv's part under oldKernelEnv.
func asOldKernel(spec *Spec) error {
	filter := seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{{Action: seccomp.Action(errnoRet | uint32(unix.EINVAL)),
			NamesWithCondtions: []seccomp.NameWithConditions{{Name: "seccomp", Conditions: seccomp.ArgumentConditions{
				{Argument: 1, Operation: seccomp.BitsSet, Value: unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV}}}}}},
	}}
	if err := seccomp.LoadFilter(filter); err != nil {
		return fmt.Errorf("loading the old kernel's filter: %w", err)
	}
	// The kernel would answer EFAULT to this program; the filter, EINVAL.
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER|unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, 0)
	if e != unix.EINVAL {
		return fmt.Errorf("the flag, refused: %v, want EINVAL", e)
	}
	// Each guarantee once, as capgate's observers keep it, the first
	// time slowly (50 ms: a record on a loaded machine), a repeat at once:
	// without the flag a signal (the Go tool's runtime preempts a raw
	// syscall after 10 ms) may restart the syscall after it was received,
	// and the kernel notify it again.
	var mu sync.Mutex
	seen := map[Key]bool{}
	spec.Observe = func(k Key) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[k] {
			seen[k] = true
			time.Sleep(50 * time.Millisecond)
			fmt.Printf("observed %s\n", k)
		}
	}
	return nil
}

// TestNotifyWithoutWaitKillable: on a kernel that refuses
// WAIT_KILLABLE_RECV (before 5.19) both trampolines load the notifying
// filter without it, and the socket is still recorded before the tool
// sees it refused (capgate's line comes before the tool's, on the one
// stdout they share), though the first record is slow enough for the
// tool's runtime to signal the waiting thread: the syscall notified anew
// is observed at once and answered.
func TestNotifyWithoutWaitKillable(t *testing.T) {
	t.Run("C", func(t *testing.T) { notifyWithoutWaitKillable(t, "") })
	t.Run("Go", func(t *testing.T) { notifyWithoutWaitKillable(t, goTrampoline(t, t.TempDir())) })
}

func notifyWithoutWaitKillable(t *testing.T, tramp string) {
	f := Probe()
	g := guarantee(NoNetwork)
	needs(t, f, g)
	w := newWorld(t)
	js, err := json.Marshal(Spec{Path: w.tool, Args: []string{"tcp=" + w.tcp, "id"}, Dir: w.work, Guarantees: g, Trampoline: tramp})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), launchAsEnv+"="+string(js), oldKernelEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || lines[0] != "observed no_network" || !strings.HasPrefix(lines[1], "tcp="+w.tcp+" denied") ||
		lines[2] != "id ok uid="+strconv.Itoa(os.Getuid()) {
		t.Errorf("the lines: %q, want the socket observed, then the tool's connect denied, then its id", lines)
	}
}
