package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/testkit"
)

// testPolling (issue 31, SSE polling): the reference
// server's test_reconnection closes capgate's upstream stream of the call
// asking for retry: 5000. capgate closes its caller's stream the same
// way: after its priming event, an event of the same stream of capgate's
// with the upstream's retry and no data, then the end of the connection
// (before, it kept the caller's stream open and waited out the retry
// itself); a resume from that event is capgate's to serve. Whether the
// result then comes is the reference server's race (it keeps its result
// only for a reconnection within about 100 ms of its close), so this
// test does not wait for it: TestPollingTimedByTheCaller shows the
// resume, and TestReferenceThroughCapgate the suite's check.
func testPolling(t *testing.T, cg *testkit.Served) {
	sid := testkit.OpenSession(t, cg.URL, "", "{}")
	// A progress token: the call gets a stream of capgate's own.
	post := testkit.SessionRequest(t, http.MethodPost, cg.URL, "", sid,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_reconnection","arguments":{},"_meta":{"progressToken":"p1"}}}`)
	if ct := post.Header.Get("Content-Type"); post.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("tools/call: %d %s", post.StatusCode, ct)
	}
	evs := readEvents(t, post.Body) // to the end of the connection capgate closes
	if len(evs) != 2 {
		t.Fatalf("the call's stream carried %+v, want the priming event and the pause", evs)
	}
	priming, pause := evs[0], evs[1]
	stream := strings.TrimSuffix(priming.id, "-0")
	if !strings.HasPrefix(priming.id, "cgs_") || priming.id == stream || pause.id != stream+"-1" || pause.retry != "5000" || pause.data != "" {
		t.Fatalf("the stream carried %+v then %+v, want capgate's priming event then its event 1 with the upstream's retry: 5000", priming, pause)
	}
	get := testkit.SessionRequest(t, http.MethodGet, cg.URL, "", sid, "", "Last-Event-ID", pause.id)
	if ct := get.Header.Get("Content-Type"); get.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("resume from the pause: %d %s", get.StatusCode, ct)
	}
}

// sseEvent is one event as a client reads it.
type sseEvent struct{ id, retry, data string }

// readEvents reads body's events to its end, within a minute.
func readEvents(t *testing.T, body io.ReadCloser) []sseEvent {
	t.Helper()
	timer := time.AfterFunc(time.Minute, func() { body.Close() })
	defer timer.Stop()
	var out []sseEvent
	for ev := range streamEvents(body) {
		out = append(out, ev)
	}
	if !timer.Stop() {
		t.Fatalf("the stream did not end within a minute; so far %+v", out)
	}
	return out
}

// streamEvents are body's events as they come, until its end.
func streamEvents(body io.Reader) <-chan sseEvent {
	out := make(chan sseEvent, 16)
	go func() {
		defer close(out)
		var ev sseEvent
		seen := false
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch {
			case line == "":
				if seen {
					out <- ev
				}
				ev, seen = sseEvent{}, false
			case field == "id":
				ev.id, seen = value, true
			case field == "retry":
				ev.retry, seen = value, true
			case field == "data":
				ev.data, seen = value, true
			}
		}
	}()
	return out
}

// toolCalls are the tool_call records of serve's audit log for
// invocation inv, once the log holds one.
func toolCalls(t *testing.T, cg *testkit.Served, inv string) []map[string]any {
	t.Helper()
	var out []map[string]any
	testkit.WaitFor(t, 30*time.Second, "the tool_call record of "+inv, func() bool {
		b, err := os.ReadFile(filepath.Join(cg.Dir, "data", "audit.jsonl"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		out = out[:0]
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["type"] == "tool_call" && m["request_id"] == inv {
				out = append(out, m)
			}
		}
		return len(out) > 0
	})
	return out
}

// pollingUpstream is an MCP server (mcp-go, 2025-11-25) whose tool poll
// closes the call's stream at once with retry: arguments.retry_ms, and
// hands its result to whoever resumes with Last-Event-ID, however late
// (an event store that keeps it). mcp-go cannot close a stream on
// purpose, so poll's calls and their resumes are served here.
type pollingUpstream struct {
	url string
	mu  sync.Mutex
	// results by the event id a resume names; resumes: the times they came.
	results map[string]string
	resumes []time.Time
}

func startPollingUpstream(t *testing.T) *pollingUpstream {
	t.Helper()
	u := &pollingUpstream{results: map[string]string{}}
	s := mcpserver.NewMCPServer("polling", "1")
	s.AddTool(mcp.NewTool("poll", mcp.WithNumber("retry_ms"), mcp.WithObject("result")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, errors.New("served by pollingUpstream")
		})
	mcpHandler := mcpserver.NewStreamableHTTPServer(s)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if last := r.Header.Get("Last-Event-ID"); r.Method == http.MethodGet && last != "" {
			u.resume(w, last)
			return
		}
		if r.Method != http.MethodPost {
			mcpHandler.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name      string `json:"name"`
				Arguments struct {
					RetryMS int             `json:"retry_ms"`
					Result  json.RawMessage `json:"result"`
				} `json:"arguments"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		switch {
		case msg.Method == "server/discover": // this upstream speaks 2025-11-25 only
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}`, msg.ID)
		case msg.Method == "tools/call" && msg.Params.Name == "poll":
			u.call(w, msg.ID, msg.Params.Arguments.RetryMS, msg.Params.Arguments.Result)
		default:
			r.Body = io.NopCloser(bytes.NewReader(body))
			mcpHandler.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	u.url = hs.URL + "/mcp"
	return u
}

// call answers a tools/call of poll: a priming event asking for retry,
// then the end of the connection; the result waits for a resume.
func (u *pollingUpstream) call(w http.ResponseWriter, id json.RawMessage, retryMS int, result json.RawMessage) {
	b := make([]byte, 8)
	rand.Read(b)
	stream := "up-" + hex.EncodeToString(b)
	u.mu.Lock()
	u.results[stream+"-0"] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "id: %s-0\nretry: %d\ndata:\n\n", stream, retryMS)
}

// resume serves a GET with Last-Event-ID: the result that followed.
func (u *pollingUpstream) resume(w http.ResponseWriter, last string) {
	u.mu.Lock()
	u.resumes = append(u.resumes, time.Now())
	res, ok := u.results[last]
	delete(u.results, last)
	u.mu.Unlock()
	if !ok {
		http.Error(w, "no stream to resume", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "id: %s\nevent: message\ndata: %s\n\n", strings.TrimSuffix(last, "-0")+"-1", res)
}

// resumed is when the upstream's streams were resumed, so far.
func (u *pollingUpstream) resumed() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.resumes)
}

// TestPollingTimedByTheCaller: an upstream closes a call's stream asking
// for a retry. capgate passes the close on to its caller and resumes the
// upstream when the caller comes back, not before (with a 30 s retry,
// nothing resumes the upstream until the caller does); a caller that does
// not come back within the retry is not waited for: capgate resumes the
// upstream by itself and keeps the result for the caller's later resume.
// Either way the result passes the output gate (a password in it is
// withheld) and the call is audited once. TestPollingResumedOnAnotherReplica
// has the caller come back to another replica.
func TestPollingTimedByTheCaller(t *testing.T) {
	t.Parallel()
	up := startPollingUpstream(t)
	config := fmt.Sprintf(`
[auth.anonymous]
sub = "polling"
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.up]
url = %q
prefix = ""
`, up.url)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: config})
	sid := testkit.OpenSession(t, cg.URL, "", "{}")
	post := func(t *testing.T, base, sid string, id, retryMS int, result string) []sseEvent {
		t.Helper()
		resp := testkit.SessionRequest(t, http.MethodPost, base, "", sid, fmt.Sprintf(
			`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"poll","arguments":{"retry_ms":%d,"result":%s},"_meta":{"progressToken":"p"}}}`,
			id, retryMS, result))
		return readEvents(t, resp.Body)
	}
	call := func(t *testing.T, id, retryMS int, result string) (stream []sseEvent) {
		t.Helper()
		evs := post(t, cg.URL, sid, id, retryMS, result)
		if n := len(evs); n != 2 || evs[1].retry != strconv.Itoa(retryMS) || evs[1].data != "" || !strings.HasPrefix(evs[1].id, "cgs_") {
			t.Fatalf("call %d: the stream carried %+v, want the priming event and then a pause with retry: %d", id, evs, retryMS)
		}
		return evs
	}
	resume := func(t *testing.T, last string) sseEvent {
		t.Helper()
		get := testkit.SessionRequest(t, http.MethodGet, cg.URL, "", sid, "", "Last-Event-ID", last)
		if get.StatusCode != http.StatusOK {
			t.Fatalf("resume from %s: %d", last, get.StatusCode)
		}
		rest := readEvents(t, get.Body)
		if len(rest) == 0 {
			t.Fatalf("the resume from %s carried nothing", last)
		}
		return rest[len(rest)-1]
	}

	t.Run("caller comes back", func(t *testing.T) {
		evs := call(t, 1, 30000, `{"content":[{"type":"text","text":"polled"}]}`)
		if got := up.resumed(); len(got) != 0 {
			t.Fatalf("the upstream was resumed %d times before the caller came back", len(got))
		}
		back := time.Now()
		last := resume(t, evs[1].id)
		got := up.resumed()
		if len(got) != 1 || got[0].Before(back) {
			t.Fatalf("the upstream was resumed at %v, the caller came back at %v: want once, after", got, back)
		}
		text, isError, inv := toolResult(t, last, 1)
		if text != "polled" || isError {
			t.Errorf("the result: %q (isError %v), want the upstream's", text, isError)
		}
		if calls := toolCalls(t, cg, inv); len(calls) != 1 || calls[0]["decision"] != "allow" {
			t.Errorf("tool_call records of invocation %s: %v, want one, allowed", inv, calls)
		}
	})
	t.Run("caller does not come back", func(t *testing.T) {
		before := len(up.resumed())
		evs := call(t, 2, 200, `{"content":[{"type":"text","text":"polled"}],"structuredContent":{"password":"hunter2-polled"}}`)
		testkit.WaitFor(t, 30*time.Second, "capgate to resume the upstream by itself", func() bool {
			return len(up.resumed()) == before+1
		})
		last := resume(t, evs[1].id)
		text, isError, inv := toolResult(t, last, 2)
		if !isError || strings.Contains(last.data, "hunter2") {
			t.Errorf("the result %s: want it withheld by the output gate", last.data)
		}
		calls := toolCalls(t, cg, inv)
		if len(calls) != 1 || calls[0]["decision"] != "deny" || calls[0]["gate"] != "output" {
			t.Errorf("tool_call records of invocation %s: %v, want one, denied at the output gate (%s)", inv, calls, text)
		}
	})
}

// toolResult reads a stream's last event as the result of call id: its
// text, isError and capgate's invocation id.
func toolResult(t *testing.T, ev sseEvent, id int) (text string, isError bool, invocation string) {
	t.Helper()
	var m struct {
		ID     int `json:"id"`
		Result *struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			IsError bool           `json:"isError"`
			Meta    map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(ev.data), &m); err != nil || m.ID != id || m.Result == nil || len(m.Result.Content) == 0 {
		t.Fatalf("event %+v is not the result of call %d", ev, id)
	}
	invocation, _ = m.Result.Meta["capgate/invocation_id"].(string)
	if invocation == "" {
		t.Fatalf("the result %s has no invocation id of capgate's", ev.data)
	}
	return m.Result.Content[0].Text, m.Result.IsError, invocation
}
