package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// sseEvent is one event of a stream as a client reads it.
type sseEvent struct {
	id, retry, data string
	hasData         bool
}

// sseEvents reads body's events into out as they come, until it ends.
func sseEvents(body io.Reader, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.hasData {
				out <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id:"):
			ev.id = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "retry:"):
			ev.retry = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			ev.data, ev.hasData = strings.TrimPrefix(line[5:], " "), true
		}
	}
}

// message is an event's JSON-RPC message, the parts the tests read.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Progress float64 `json:"progress"`
	} `json:"params"`
	Result *struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
}

func readMessage(t *testing.T, ev sseEvent) message {
	t.Helper()
	var m message
	if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
		t.Fatalf("event %q: %v", ev.data, err)
	}
	return m
}

const slowCall = `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"fx__slow","arguments":{"delay_ms":DELAY},"_meta":{"progressToken":"p9"}}}`

// A call's progress goes on the call's own stream, in order, each before
// its result, while the session's GET stream is open (mcp-go alone splits
// it between the two, so this failed about seven times in eight per call).
// The stream starts with a priming event and every event has an id.
func TestStreamedCallKeepsItsProgress(t *testing.T) {
	_, front := open(t)
	tok := mint(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, front, tok, "{}")
	get := testkit.SessionRequest(t, http.MethodGet, front, tok, sid, "")
	if get.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d", get.StatusCode)
	}
	var (
		mu       sync.Mutex
		onGet    []string
		getFeeds = make(chan sseEvent, 64)
	)
	go sseEvents(get.Body, getFeeds)
	go func() {
		for ev := range getFeeds {
			mu.Lock()
			onGet = append(onGet, ev.data)
			mu.Unlock()
		}
	}()

	for round := range 4 {
		resp := testkit.SessionRequest(t, http.MethodPost, front, tok, sid, strings.Replace(slowCall, "DELAY", "1", 1))
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
			t.Fatalf("round %d: %d %s", round, resp.StatusCode, ct)
		}
		evs := make(chan sseEvent, 16)
		go sseEvents(resp.Body, evs)
		var got []sseEvent
		for ev := range evs {
			got = append(got, ev)
		}
		if len(got) != 5 {
			t.Fatalf("round %d: %d events, want priming, 3 progress, result: %+v", round, len(got), got)
		}
		if p := got[0]; p.id == "" || p.retry != "1000" || p.data != "" {
			t.Errorf("round %d: first event %+v, want a priming event (id, retry, no data)", round, p)
		}
		for i, ev := range got[1:4] {
			m := readMessage(t, ev)
			if m.Method != "notifications/progress" || m.Params.Progress != float64(i+1) || ev.id == "" {
				t.Errorf("round %d: event %d = %s (id %q), want progress %d with an id", round, i+1, ev.data, ev.id, i+1)
			}
		}
		if m := readMessage(t, got[4]); string(m.ID) != "9" || m.Result == nil || len(m.Result.Content) != 1 || m.Result.Content[0].Text != "done" {
			t.Errorf("round %d: last event %s, want the result", round, got[4].data)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, data := range onGet {
		if strings.Contains(data, "notifications/progress") {
			t.Errorf("a call's progress went on the session's GET stream: %s", data)
		}
	}
}

// A client whose connection broke resumes the call's stream with GET and
// Last-Event-ID: it gets what followed that event, then the result. A
// Last-Event-ID of another session, or one no stream here sent, is 404.
func TestStreamedCallResumes(t *testing.T) {
	_, front := open(t)
	tok := mint(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, front, tok, "{}")
	other := testkit.OpenSession(t, front, tok, "{}")

	resp := testkit.SessionRequest(t, http.MethodPost, front, tok, sid, strings.Replace(slowCall, "DELAY", "300", 1))
	evs := make(chan sseEvent, 16)
	go sseEvents(resp.Body, evs)
	priming := <-evs
	first := <-evs // progress 1, sent before the first pause
	if priming.id == "" || readMessage(t, first).Params.Progress != 1 {
		t.Fatalf("the stream began with %+v, %+v", priming, first)
	}
	resp.Body.Close() // the connection breaks mid-call

	if r := testkit.SessionRequest(t, http.MethodGet, front, tok, other, "", "Last-Event-ID", first.id); r.StatusCode != http.StatusNotFound {
		t.Errorf("resume from another session: %d, want 404", r.StatusCode)
	}
	if r := testkit.SessionRequest(t, http.MethodGet, front, tok, sid, "", "Last-Event-ID", streamPrefix+"00ff-3"); r.StatusCode != http.StatusNotFound {
		t.Errorf("resume of an unknown stream: %d, want 404", r.StatusCode)
	}

	get := testkit.SessionRequest(t, http.MethodGet, front, tok, sid, "", "Last-Event-ID", first.id)
	if ct := get.Header.Get("Content-Type"); get.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("resume: %d %s", get.StatusCode, ct)
	}
	rest := make(chan sseEvent, 16)
	go sseEvents(get.Body, rest)
	var progress []float64
	var last message
	for ev := range rest {
		if ev.id == "" {
			t.Errorf("resumed event without an id: %+v", ev)
		}
		m := readMessage(t, ev)
		if m.Method == "notifications/progress" {
			progress = append(progress, m.Params.Progress)
		}
		last = m
	}
	if len(progress) != 2 || progress[0] != 2 || progress[1] != 3 {
		t.Errorf("resumed progress %v, want [2 3]", progress)
	}
	if string(last.ID) != "9" || last.Result == nil || len(last.Result.Content) != 1 || last.Result.Content[0].Text != "done" {
		t.Errorf("the resumed stream ended with %+v, want the result", last)
	}
	// Delivered to its end, the stream is gone.
	if r := testkit.SessionRequest(t, http.MethodGet, front, tok, sid, "", "Last-Event-ID", first.id); r.StatusCode != http.StatusNotFound {
		t.Errorf("resume of a delivered stream: %d, want 404", r.StatusCode)
	}
}

// A streamed call goes on when its client's connection breaks, and ends
// when the client has not come back within resumeWait: the upstream call
// is cancelled, and a late resume gets the call's end (an error).
func TestStreamedCallCancelledWhenNobodyResumes(t *testing.T) {
	s, front := open(t)
	defer func(w time.Duration) { resumeWait = w }(resumeWait)
	resumeWait = 200 * time.Millisecond
	tok := mint(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, front, tok, "{}")

	// Three steps of a minute each, unless cancelled.
	resp := testkit.SessionRequest(t, http.MethodPost, front, tok, sid, strings.Replace(slowCall, "DELAY", "60000", 1))
	evs := make(chan sseEvent, 16)
	go sseEvents(resp.Body, evs)
	priming, first := <-evs, <-evs
	if readMessage(t, first).Params.Progress != 1 {
		t.Fatalf("the stream began with %+v, %+v", priming, first)
	}
	resp.Body.Close()
	stream, _, _ := parseEventID(priming.id)
	testkit.WaitFor(t, 30*time.Second, "the call to end", func() bool {
		st := s.MCP.streams.get(stream)
		if st == nil {
			return false
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.done
	})
	get := testkit.SessionRequest(t, http.MethodGet, front, tok, sid, "", "Last-Event-ID", first.id)
	rest := make(chan sseEvent, 16)
	go sseEvents(get.Body, rest)
	var last sseEvent
	for ev := range rest {
		last = ev
	}
	if !strings.Contains(last.data, `"id":9`) || !strings.Contains(last.data, "error") || strings.Contains(last.data, `"text":"done"`) {
		t.Errorf("the abandoned call ended with %s, want an error", last.data)
	}
}

// A session's notifications/cancelled ends the streamed call it names.
func TestStreamedCallCancelled(t *testing.T) {
	_, front := open(t)
	tok := mint(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, front, tok, "{}")
	resp := testkit.SessionRequest(t, http.MethodPost, front, tok, sid, strings.Replace(slowCall, "DELAY", "60000", 1))
	evs := make(chan sseEvent, 16)
	go sseEvents(resp.Body, evs)
	<-evs // priming
	<-evs // progress 1: the call runs
	if st, _, b := testkit.PostSession(t, front, tok, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,"reason":"enough"}}`); st != http.StatusAccepted {
		t.Fatalf("notifications/cancelled: %d %s", st, b)
	}
	var last sseEvent
	for ev := range evs {
		last = ev
	}
	if !strings.Contains(last.data, `"id":9`) || strings.Contains(last.data, `"text":"done"`) {
		t.Errorf("the cancelled call ended with %s", last.data)
	}
}
