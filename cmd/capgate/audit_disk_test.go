package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// TestServeAuditDiskFull is the attack: the disk under the audit log fills
// up while a client keeps calling. Every call that ran has its record;
// every other call was refused with capability_backend_unavailable at the
// audit gate; serve said so once (one ERROR), and once when it recovered
// (one INFO); capgate audit verify checks a log holding every call that ran.
func TestServeAuditDiskFull(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("needs to mount a small tmpfs to fill it up (run as root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", disk).Run() })

	auditPath := filepath.Join(disk, "audit.jsonl")
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Secret: "serve-test-secret-value-9f8e7d", Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]

[audit]
path = %q
# Small, so that the calls running when the disk fills outrun the space
# reserved ahead of the log: only admission keeps their records.
reserve = "256KiB"

[mcp.servers.fx]
command = %q

[mcp.servers.fx.tools.t_00]
risk = "LOW"
`, auditPath, testkit.Build(t, testkit.MCPFixture))}))
	stderr := s.logs
	tok := s.mint(t, "alice", "private")

	call := func(c *http.Client) (requestID, code, gate string) {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":%q,"capability":"mcp:fx:t_00","input":{}}}`, tok)
		resp, err := c.Post("http://"+s.addr+"/rpc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return "", "", ""
		}
		defer resp.Body.Close()
		var r struct {
			Result struct {
				RequestID string `json:"request_id"`
			}
			Error *struct {
				Message string
				Data    struct{ Code, Gate, Hint string }
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Error(err)
			return "", "", ""
		}
		if r.Error != nil {
			return "", r.Error.Data.Code, r.Error.Data.Gate
		}
		return r.Result.RequestID, "", ""
	}
	if id, code, _ := call(http.DefaultClient); id == "" {
		t.Fatalf("before the disk fills: %s", code)
	}

	// The disk fills; a client keeps calling, more calls than the space
	// reserved ahead of the log could record.
	filler := filepath.Join(disk, "filler")
	fillDisk(t, filler)
	const n, workers = 3000, 32
	var (
		mu      sync.Mutex
		ran     []string
		refused int
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{}
			for i := w; i < n; i += workers {
				id, code, gate := call(c)
				mu.Lock()
				switch {
				case id != "":
					ran = append(ran, id)
				case code == "capability_backend_unavailable" && gate == "audit":
					refused++
				default:
					t.Errorf("call %d: neither ran nor refused by the audit gate: %s %s", i, code, gate)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("disk full: %d of %d calls ran, %d refused", len(ran), n, refused)
	if refused == 0 || len(ran)+refused != n {
		t.Errorf("%d ran, %d refused, of %d: calls ran with the audit log's disk full", len(ran), refused, n)
	}
	// The calls that ran have their records on disk, with the disk still
	// full: in the space reserved ahead of the log.
	var missing int
	if !testkit.Poll(5*time.Second, func() bool { _, missing = records(t, auditPath, ran); return missing == 0 }) {
		ls, _ := exec.Command("ls", "-la", disk).CombinedOutput()
		df, _ := exec.Command("df", disk).CombinedOutput()
		t.Errorf("with the disk full, %d of the %d calls that ran have no record on disk\n%s\n%s%s", missing, len(ran), stderr(), ls, df)
	}
	// serve writes its log lines a window's worth at a time: wait for it.
	testkit.Poll(5*time.Second, func() bool { return strings.Contains(stderr(), "audit log cannot record calls") })
	if got := strings.Count(stderr(), "audit log cannot record calls"); got != 1 || !strings.Contains(stderr(), "level=ERROR msg=\"audit log cannot record calls") {
		t.Errorf("%d ERROR lines for the full disk, want 1:\n%s", got, stderr())
	}

	// Space comes back: serve says so once, and calls run again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(10*time.Second, func() bool { return strings.Contains(stderr(), "audit log recovered") })
	id, code, _ := call(http.DefaultClient)
	if id == "" {
		t.Fatalf("after recovery: %s\n%s", code, stderr())
	}
	ran = append(ran, id)
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		t.Errorf("serve: %v\n%s", err, stderr())
	}
	log := stderr()
	if strings.Count(log, "level=INFO msg=\"audit log recovered") != 1 || strings.Count(log, "audit log cannot record calls") != 1 {
		t.Errorf("want one ERROR and one INFO line about the audit log:\n%s", log)
	}
	if strings.Contains(log, tok) || strings.Contains(log, s.secret) {
		t.Error("serve's log holds the token or the secret")
	}

	// Every call that ran has its record.
	lines, missing := records(t, auditPath, ran)
	if missing > 0 {
		t.Errorf("%d of the %d calls that ran have no audit record", missing, len(ran))
	}
	// And audit verify checks that log.
	out, errb, code2 := s.run(t, nil, "audit", "verify", "--config", s.config)
	if want := fmt.Sprintf("%s: %d lines, chain intact", auditPath, lines); code2 != 0 || !strings.HasPrefix(out, want) {
		t.Errorf("audit verify: %d %q %q, want %q", code2, out, errb, want)
	}
}

// fillDisk writes path until its filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{64 << 10, 4 << 10} { // to the last page
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// records reads the audit log at path and returns its lines and how many
// of the request ids have no tool_call record of an allowed call.
func records(t *testing.T, path string, ids []string) (lines, missing int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Whole lines only: serve may be writing the next group.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	recorded := map[string]bool{}
	for line := range bytes.Lines(data) {
		lines++
		var e struct {
			Type, Decision string
			RequestID      string `json:"request_id"`
		}
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("%s:%d: %v", path, lines, err)
		}
		if e.Type == "tool_call" && e.Decision == "allow" {
			recorded[e.RequestID] = true
		}
	}
	for _, id := range ids {
		if !recorded[id] {
			missing++
		}
	}
	return lines, missing
}
