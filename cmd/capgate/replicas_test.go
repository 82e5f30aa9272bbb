package main

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"net"
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
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/token"
)

// TestReplicas runs two real capgate serve replicas on one real
// PostgreSQL behind a real haproxy that checks /readyz, and holds them to
// what one capgate promises: an approval is used once, an idempotency key
// runs once, a rate limit is one budget, and a replica killed with SIGKILL
// loses no call once the balancer's health check has noticed.
func TestReplicas(t *testing.T) {
	t.Parallel()
	haproxy := lookHAProxy(t)
	url := pgtest.Start(t)
	extra, log := replicaPack(t)
	extra += fmt.Sprintf(`
[store]
url = %q

[policy.rate_limit]
per_minute = 1
burst = 6

# A call waits up to a minute for another's under its key (a deadline,
# not a measure: under load a run took over the 5 s default).
[idempotency]
wait = "1m"
`, url)
	const secret = "replicas-test-secret-0123456789ab"
	env := []string{"CAPGATE_STORE_KEY=" + strings.Repeat("5e", 32)}
	var reps [2]*testkit.Served
	for i := range reps {
		reps[i] = testkit.StartCapgate(t, testkit.Capgate{Secret: secret, Config: extra, Env: env})
	}
	a, b := &served{addr: reps[0].Addr}, &served{addr: reps[1].Addr}
	mint := func(sub string) string { return reps[0].Token(t, token.Claims{Sub: sub, ChatType: "private"}) }

	t.Run("approval used once", func(t *testing.T) {
		erin := mint("erin")
		ask := a.invokeRaw(t, erin, "ext:rep:danger", `{"cmd":"deploy"}`, "")
		id := replicaApprovalID(t, ask)
		// Approved with the CLI against replica b's config: one store.
		if code, out, errb := runCLI("approve", id, "--config", reps[1].ConfigPath, "--by", "ops"); code != 0 {
			t.Fatalf("approve: %d %s %s", code, out, errb)
		}
		before := len(runs(t, log))
		answers := make([]rpcAnswer, 4)
		var wg sync.WaitGroup
		for i := range answers {
			s := []*served{a, b}[i%2]
			wg.Go(func() { answers[i] = s.invokeRaw(t, erin, "ext:rep:danger", `{"cmd":"deploy"}`, "") })
		}
		wg.Wait()
		ok := 0
		for _, ans := range answers {
			switch ans.Code {
			case "":
				ok++
			case "approval_required":
			default:
				t.Errorf("call on the approval: %+v", ans)
			}
		}
		if got := len(runs(t, log)) - before; ok != 1 || got != 1 {
			t.Errorf("4 calls on one approval across two replicas: %d allowed, %d ran; want 1 and 1: %+v", ok, got, answers)
		}
	})

	t.Run("idempotency key runs once", func(t *testing.T) {
		alice := mint("alice")
		before := len(runs(t, log))
		answers := make([]rpcAnswer, 6)
		var wg sync.WaitGroup
		for i := range answers {
			s := []*served{a, b}[i%2]
			wg.Go(func() { answers[i] = s.invokeRaw(t, alice, "ext:rep:record", `{"note":"pay invoice 7"}`, "key-1") })
		}
		wg.Wait()
		if got := runs(t, log)[before:]; len(got) != 1 {
			t.Fatalf("6 calls with one key on two replicas ran the tool %d times: %q", len(got), got)
		}
		for i, ans := range answers {
			if ans.Code != "" || ans != answers[0] {
				t.Errorf("call %d: %+v; call 0: %+v", i, ans, answers[0])
			}
		}
	})

	t.Run("rate limit is one budget", func(t *testing.T) {
		carol := mint("carol")
		for i := range 6 {
			if ans := []*served{a, b}[i%2].invokeRaw(t, carol, "ext:rep:ping", `{}`, ""); ans.Code != "" {
				t.Fatalf("call %d of a burst of 6: %+v", i, ans)
			}
		}
		for _, s := range []*served{a, b} {
			if ans := s.invokeRaw(t, carol, "ext:rep:ping", `{}`, ""); ans.Code != "rate_limited" {
				t.Errorf("call 7 on %s: %+v, want rate_limited", s.addr, ans)
			}
		}
	})

	t.Run("session opened on one is used on the other", func(t *testing.T) {
		frank := mint("frank")
		sid := testkit.OpenSession(t, reps[0].URL, frank, "{}")
		for i, rep := range []*testkit.Served{reps[1], reps[0], reps[1]} {
			st, _, body := testkit.PostSession(t, rep.URL, frank, sid, fmt.Sprintf(
				`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"rep__ping","arguments":{}}}`, i+1))
			if st != http.StatusOK || !strings.Contains(string(body), "ok") || strings.Contains(string(body), `"isError":true`) {
				t.Fatalf("call %d in a session opened on r1, sent to %s: %d %s", i+1, rep.Addr, st, body)
			}
		}
	})

	t.Run("SIGKILL behind the balancer", func(t *testing.T) {
		lb := startHAProxy(t, haproxy, reps[0].Addr, reps[1].Addr)
		lb.waitStatus(t, map[string]string{"r1": "UP", "r2": "UP"})
		front := &served{addr: lb.addr}
		call := func(i int) rpcAnswer {
			// A caller each, so the rate limit stays out of it.
			return front.invokeRaw(t, mint(fmt.Sprint("dave", i)), "ext:rep:ping", `{}`, "")
		}
		for i := range 4 {
			if ans := call(i); ans.Code != "" {
				t.Fatalf("call %d through the balancer: %+v", i, ans)
			}
		}
		if err := reps[1].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		reps[1].Cmd.Wait()
		lb.waitStatus(t, map[string]string{"r1": "UP", "r2": "DOWN"})
		for i := 4; i < 24; i++ {
			if ans := call(i); ans.Code != "" {
				t.Errorf("call %d after r2 was marked down: %+v", i, ans)
			}
		}
	})
}

// lookHAProxy is Debian's haproxy; the test skips without it, except
// under CI.
func lookHAProxy(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"haproxy", "/usr/sbin/haproxy"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("haproxy is not installed (apt-get install haproxy)")
	}
	t.Skip("haproxy is not installed (apt-get install haproxy)")
	return ""
}

// replicaPack writes the extension pack "rep": record (mutating) and
// danger (CRITICAL) append their input to the returned log, one line per
// run; ping answers at once. The config grants every caller all three.
func replicaPack(t *testing.T) (config, log string) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rep")
	// Apart from the pack: no tool creates files beside its own pack,
	// which the sandbox carves out of its writes.
	log = filepath.Join(testkit.ToolDir(t), "runs.log")
	script := `#!/bin/sh
input=$(cat)
if [ "$1" = ping ]; then echo '{"ok": true}'; exit 0; fi
printf '%s\n' "$input" >> ` + shellQuote(log) + `
sleep 0.3
echo '{"done": true}'
`
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "run"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := `id: rep
name: Replicas
description: Commands that record every run
commands:
  record:
    description: Record a note
    run: ["./bin/run"]
    input_schema: {type: object}
    risk: LOW
    mutating: true
  ping:
    description: Answer
    run: ["./bin/run", "ping"]
    input_schema: {type: object}
    risk: LOW
  danger:
    description: Run a command
    run: ["./bin/run"]
    input_schema: {type: object, properties: {cmd: {type: string}}, required: [cmd]}
    risk: CRITICAL
`
	writeFile(t, filepath.Join(dir, "extension.yaml"), manifest)
	return fmt.Sprintf("[extensions]\npaths = [%q]\n\n[policy]\ngrants = [\"rye.execute.tool.ext.rep.*\"]\n", root), log
}

func replicaApprovalID(t *testing.T, a rpcAnswer) string {
	t.Helper()
	i := strings.Index(a.Message, "apr_")
	if a.Code != "approval_required" || i < 0 || len(a.Message) < i+36 {
		t.Fatalf("%+v, want approval_required naming an approval", a)
	}
	return a.Message[i : i+36]
}

// balancer is a running haproxy with a stats socket.
type balancer struct {
	addr, sock string
}

// startHAProxy runs haproxy in front of the two replicas, checking
// /readyz every 100 ms; two failures mark a replica down. No retries
// unless backend (lines added to the backend section) says so: the health
// check alone must keep calls off a dead replica. A check may wait 10 s
// for its answer: without "timeout check" haproxy gives a check only the
// interval, so on a loaded machine a live replica answering /readyz in
// more than 100 ms was marked down (both at once, now and then), while a
// dead one still fails its check at once (connection refused).
func startHAProxy(t *testing.T, bin, r1, r2 string, backend ...string) *balancer {
	t.Helper()
	// A free port can be taken by another process before haproxy binds it
	// (it then exits, "cannot bind socket"): start again on another.
	for attempt := 1; ; attempt++ {
		lb, log, ok := tryHAProxy(t, bin, r1, r2, backend)
		if ok {
			return lb
		}
		if attempt == 3 || !strings.Contains(log, "cannot bind socket") {
			t.Fatalf("haproxy did not start:\n%s", log)
		}
		t.Logf("haproxy could not bind %s; starting it on another port", lb.addr)
	}
}

// tryHAProxy starts haproxy once and waits for its stats socket; it
// reports false, with haproxy's log, when haproxy exits first.
func tryHAProxy(t *testing.T, bin, r1, r2 string, backend []string) (*balancer, string, bool) {
	t.Helper()
	dir := t.TempDir()
	lb := &balancer{addr: testkit.FreeAddr(t), sock: filepath.Join(dir, "haproxy.sock")}
	cfg := fmt.Sprintf(`global
    stats socket %s level admin
defaults
    mode http
    retries 0
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    timeout check 10s
frontend fe
    bind %s
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk
    # HTTP/1.1 with a Host: capgate refuses a loopback request naming no host.
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
    default-server inter 100ms fall 2 rise 1
`, lb.sock, lb.addr)
	// Before the servers, so that a default-server line here applies.
	for _, l := range backend {
		cfg += "    " + l + "\n"
	}
	cfg += fmt.Sprintf("    server r1 %s check\n    server r2 %s check\n", r1, r2)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "haproxy.log")
	cmd := exec.Command(bin, "-db", "-f", path)
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // haproxy holds its own copy
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	gone := func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}
	testkit.WaitFor(t, 30*time.Second, "haproxy's stats socket or its exit", func() bool {
		if gone() {
			return true
		}
		_, err := lb.status()
		return err == nil
	})
	if gone() {
		b, _ := os.ReadFile(logPath)
		return lb, string(b), false
	}
	return lb, "", true
}

// status is each server's state in haproxy's "show stat": UP, DOWN, ...
func (lb *balancer) status() (map[string]string, error) {
	c, err := net.DialTimeout("unix", lb.sock, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return nil, err
	}
	r := csv.NewReader(bufio.NewReader(c))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("show stat: %v", err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[strings.TrimPrefix(h, "# ")] = i
	}
	st := map[string]string{}
	for _, row := range rows[1:] {
		if len(row) > col["status"] && row[col["pxname"]] == "replicas" {
			st[row[col["svname"]]] = strings.Fields(row[col["status"]] + " ")[0]
		}
	}
	return st, nil
}

// waitStatus waits (10 s at most) until the servers are in want.
func (lb *balancer) waitStatus(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	var err error
	if testkit.Poll(10*time.Second, func() bool {
		if got, err = lb.status(); err != nil {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}) {
		return
	}
	t.Fatalf("haproxy servers %v (%v), want %v", got, err, want)
}
