//go:build unix

package testkit

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestFreeze: a process Freeze returned from answers nothing (a request
// sent at once gets no answer while it is stopped), and answers again
// once continued. The process is this test binary serving HTTP, with
// GOMAXPROCS 2 so that more than one thread can run it.
func TestFreeze(t *testing.T) {
	if os.Getenv("TESTKIT_FREEZE_CHILD") != "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(l.Addr())
		http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreeze$")
	cmd.Env = append(os.Environ(), "TESTKIT_FREEZE_CHILD=1", "GOMAXPROCS=2")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("the child printed no address")
	}
	url := "http://" + sc.Text()
	// A stopped process cannot answer sooner for being slow: waiting
	// longer would only make a failure likelier, never a pass.
	client := &http.Client{Timeout: 100 * time.Millisecond}
	for round := range 5 {
		if r, err := (&http.Client{Timeout: time.Minute}).Get(url); err != nil {
			t.Fatalf("round %d, running: %v", round, err)
		} else {
			r.Body.Close()
		}
		Freeze(t, cmd.Process.Pid)
		if r, err := client.Get(url); err == nil {
			r.Body.Close()
			t.Fatalf("round %d: the frozen process answered %s", round, r.Status)
		}
		if err := syscall.Kill(cmd.Process.Pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
}
