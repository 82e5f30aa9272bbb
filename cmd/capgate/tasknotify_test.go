package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/token"
)

// taskListen is one subscriptions/listen stream for task ids, as a client
// reads it.
type taskListen struct {
	agreed  []string
	ack     map[string]json.RawMessage      // the acknowledgement's notifications
	ended   bool                            // the stream ended with the listen's result
	notices chan map[string]json.RawMessage // notifications/tasks params, raw
	raw     chan string                     // the same, as they came
}

// listenTasks opens a subscriptions/listen for ids as tok at base,
// declaring the tasks extension, and reads its acknowledgement; the
// notifications that follow arrive on the returned channels until ctx ends.
func listenTasks(ctx context.Context, t *testing.T, base, tok string, ids ...string) *taskListen {
	t.Helper()
	return listenFor(ctx, t, base, tok, "", ids...)
}

// listenFor is listenTasks asking for more: more is members of the
// listen's notifications filter besides taskIds ("" for none).
func listenFor(ctx context.Context, t *testing.T, base, tok, more string, ids ...string) *taskListen {
	t.Helper()
	q, _ := json.Marshal(ids)
	if more != "" {
		more = "," + more
	}
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":"L1","method":"subscriptions/listen","params":{"notifications":{"taskIds":%s%s},%s}}`, q, more, metaTasks)
	type message struct {
		ID     json.RawMessage            `json:"id"`
		Method string                     `json:"method"`
		Params map[string]json.RawMessage `json:"params"`
		Result json.RawMessage            `json:"result"`
	}
	events := openListen(ctx, t, base, tok, body)
	l := &taskListen{notices: make(chan map[string]json.RawMessage, 64), raw: make(chan string, 64)}
	first, ok := <-events
	var ack message
	if !ok || json.Unmarshal(first, &ack) != nil || ack.Method != "notifications/subscriptions/acknowledged" {
		t.Fatalf("subscriptions/listen: want the acknowledgement first, got %q", first)
	}
	var agreed struct {
		TaskIDs []string `json:"taskIds"`
	}
	json.Unmarshal(ack.Params["notifications"], &agreed)
	l.agreed = agreed.TaskIDs
	json.Unmarshal(ack.Params["notifications"], &l.ack)
	if !strings.Contains(string(ack.Params["_meta"]), `"io.modelcontextprotocol/subscriptionId":"L1"`) {
		t.Errorf("the acknowledgement does not name its listen: %s", first)
	}
	if len(l.agreed) == 0 && more == "" {
		// Nothing agreed: the listen's result ends the stream.
		last, ok := <-events
		var res message
		if !ok || json.Unmarshal(last, &res) != nil || string(res.ID) != `"L1"` || res.Result == nil {
			t.Fatalf("a listen agreed to nothing: want its result next, got %q", last)
		}
		l.ended = true
		return l
	}
	go func() {
		for ev := range events {
			var m message
			if json.Unmarshal(ev, &m) != nil || m.Method != "notifications/tasks" {
				continue
			}
			l.raw <- string(ev)
			l.notices <- m.Params
		}
	}()
	return l
}

// upstreamHex is a bare 32-hex-digit id: the fixture's task ids are; the
// only ones a caller may see are capgate's, "cgt_" and 32 hex digits.
var upstreamHex = regexp.MustCompile(`(^|[^_0-9a-f])[0-9a-f]{32}`)

// awaitNotice waits for l's notification of task id in status, failing on
// any notification of another task before it.
func awaitNotice(t *testing.T, who string, l *taskListen, id, status string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case n := <-l.notices:
			raw := <-l.raw
			var got, st string
			json.Unmarshal(n["taskId"], &got)
			json.Unmarshal(n["status"], &st)
			if got != id {
				t.Fatalf("%s got a notification of task %q, not its own %s: %s", who, got, id, raw)
			}
			if upstreamHex.MatchString(raw) {
				t.Fatalf("%s's notification carries an upstream task id: %s", who, raw)
			}
			if !strings.Contains(string(n["_meta"]), `"io.modelcontextprotocol/subscriptionId":"L1"`) {
				t.Errorf("%s's notification does not name its listen: %s", who, raw)
			}
			if st == status {
				return raw
			}
		case <-deadline:
			t.Fatalf("%s: no notification of %s reaching %s within 30s", who, id, status)
		}
	}
}

// noNotice checks l has received no notification by now.
func noNotice(t *testing.T, who string, l *taskListen) {
	t.Helper()
	select {
	case raw := <-l.raw:
		t.Fatalf("%s received a notification it must not: %s", who, raw)
	default:
	}
}

// answerTask answers the one input request of tok's task id through base.
func answerTask(t *testing.T, base, tok, id string) {
	t.Helper()
	a := awaitStatus(t, base, tok, id, "input_required")
	var reqs map[string]json.RawMessage
	json.Unmarshal(a.Result["inputRequests"], &reqs)
	if len(reqs) != 1 {
		t.Fatalf("want one input request: %s", a.Raw)
	}
	for key := range reqs {
		u := post2026(t, base, tok, "tasks/update", id, fmt.Sprintf(`"taskId":%q,"inputResponses":{%q:{"action":"accept","content":{"ok":true}}},%s`, id, key, metaTasks))
		if u.Status != 200 || u.Error != nil {
			t.Fatalf("tasks/update: %d %s", u.Status, u.Raw)
		}
	}
}

// TestTaskNotifications: task status notifications (SEP-2663) through two
// capgate replicas on one PostgreSQL, over an upstream that sends them.
// Alice and bob each have a task on the same upstream, made through one
// replica; each listens through the other replica for both tasks. Each is
// agreed to, and receives, its own task's notifications only, under
// capgate's id, never the upstream's; a listen for another's task alone is
// agreed to nothing and ends. Bob's stream is checked empty once alice's
// notification has arrived, and again once his own has (the upstream
// writes each stream in order, so alice's would have come before). With
// -notify-all the upstream sends every task's notifications on every
// stream: capgate passes on only those of the tasks the stream asked for.
func TestTaskNotifications(t *testing.T) {
	t.Parallel()
	url := pgtest.Start(t)
	for _, mode := range []string{"per task", "notify-all"} {
		t.Run(mode, func(t *testing.T) {
			addr := testkit.FreeAddr(t)
			args := []string{"-http", addr}
			if mode == "notify-all" {
				args = append(args, "-notify-all")
			}
			testkit.ServeFixture(t, testkit.TasksFixture, 15*time.Second, addr, args...)
			db := url
			if mode == "notify-all" {
				db = pgtest.Start(t) // a fresh database
			}
			r1, r2 := startTaskReplicas(t, addr, db)
			alice := r1.Token(t, token.Claims{Sub: "alice"})
			bob := r1.Token(t, token.Claims{Sub: "bob"})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			aliceTask := createTask(t, r1.URL, alice, "tk__confirm_delete", `{"filename":"a.txt"}`)
			aliceLong := createTask(t, r1.URL, alice, "tk__slow_compute", `{"seconds":600,"label":"long"}`)
			bobTask := createTask(t, r2.URL, bob, "tk__confirm_delete", `{"filename":"b.txt"}`)

			// Bob asking for alice's task alone is agreed to nothing; with
			// list changes, to those alone.
			if l := listenTasks(ctx, t, r2.URL, bob, aliceTask); len(l.agreed) != 0 || !l.ended {
				t.Fatalf("bob's listen for alice's task: agreed %v", l.agreed)
			}
			if l := listenFor(ctx, t, r2.URL, bob, `"toolsListChanged":true`, aliceTask); len(l.agreed) != 0 || string(l.ack["toolsListChanged"]) != "true" {
				t.Fatalf("bob's listen for list changes and alice's task: agreed %s, %s", l.ack["taskIds"], l.ack["toolsListChanged"])
			}
			al := listenTasks(ctx, t, r2.URL, alice, aliceTask, bobTask, aliceLong)
			// Bob's listen asks for list changes too: mcp-go serves that
			// part, and capgate adds the task ids to its acknowledgement.
			bl := listenFor(ctx, t, r1.URL, bob, `"toolsListChanged":true`, bobTask, aliceTask, aliceLong)
			if string(bl.ack["toolsListChanged"]) != "true" {
				t.Errorf("bob's listen for list changes and tasks: list changes not agreed: %s", bl.ack["toolsListChanged"])
			}
			if got, want := slices.Sorted(slices.Values(al.agreed)), slices.Sorted(slices.Values([]string{aliceTask, aliceLong})); !slices.Equal(got, want) {
				t.Fatalf("alice's listen through r2: agreed %v, want only her tasks %v", got, want)
			}
			if !slices.Equal(bl.agreed, []string{bobTask}) {
				t.Fatalf("bob's listen through r1: agreed %v, want only his task %s", bl.agreed, bobTask)
			}

			// Alice's task, made through r1, completes: she hears of it
			// through r2; bob hears nothing.
			answerTask(t, r1.URL, alice, aliceTask)
			raw := awaitNotice(t, "alice", al, aliceTask, "completed")
			if !strings.Contains(raw, `confirmed a.txt: {\"ok\":true}`) {
				t.Errorf("alice's completed notification without the task's result: %s", raw)
			}
			noNotice(t, "bob, after alice's task completed", bl)

			// Bob's completes: he hears of it through r1, and of nothing
			// before it.
			answerTask(t, r2.URL, bob, bobTask)
			if raw := awaitNotice(t, "bob", bl, bobTask, "completed"); !strings.Contains(raw, `confirmed b.txt`) {
				t.Errorf("bob's completed notification without the task's result: %s", raw)
			}
			// Alice cancels her other task after that: she hears of it, and
			// of nothing of bob's before it.
			if a := post2026(t, r2.URL, alice, "tasks/cancel", aliceLong, fmt.Sprintf(`"taskId":%q,%s`, aliceLong, metaTasks)); a.Status != 200 || a.Error != nil {
				t.Fatalf("tasks/cancel: %d %s", a.Status, a.Raw)
			}
			awaitNotice(t, "alice", al, aliceLong, "cancelled")
			noNotice(t, "bob, after alice's cancel", bl)

			// Each listen is audited where it was served: bob's on r1
			// agreed to one of his three ids, his listen on r2 for alice's
			// task alone to none.
			audited := func(r *testkit.Served, decision, detail string) {
				t.Helper()
				var b []byte
				if !testkit.Poll(10*time.Second, func() bool {
					b, _ = os.ReadFile(filepath.Join(r.Dir, "data", "audit.jsonl"))
					for _, line := range strings.Split(string(b), "\n") {
						var e struct{ Type, Sub, Decision, Detail string }
						if json.Unmarshal([]byte(line), &e) == nil && e.Type == "task" && e.Sub == "bob" && e.Decision == decision && e.Detail == detail {
							return true
						}
					}
					return false
				}) {
					t.Errorf("no audit record of bob's %s %q:\n%s", decision, detail, b)
				}
			}
			audited(r1, "allow", "subscriptions/listen: 1 of 3 task ids")
			audited(r2, "deny", "subscriptions/listen: 0 of 1 task ids")
		})
	}
}

// openListen posts a 2026-07-28 subscriptions/listen body as tok at base
// and streams the data of each event it answers with until ctx ends.
func openListen(ctx context.Context, t *testing.T, base, tok, body string) <-chan []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "subscriptions/listen"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("subscriptions/listen: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan []byte, 64)
	go func() {
		defer close(events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- []byte(data)
			}
		}
	}()
	return events
}
