package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// traceKeys are the trace's capability_check keys, in its order.
var traceKeys = []string{"type", "tool_name", "runner", "resolved_source", "capability", "allowed",
	"guarantee_source", "reason", "protocol_version"}

var capgateKeys = []string{"time", "seq", "replica", "sub", "chat_id", "chat_type", "tool", "kind", "protocol", "required",
	"layer", "explanation", "capability_id", "decision", "gate", "code",
	"duration_ms", "input_sha256", "request_id", "approval_id", "flow_id", "account_ref", "guarantees", "detail", "prev"}

// fullEvent has every field set.
func fullEvent(typ string, i int) Event {
	return Event{
		Type:            typ,
		ToolName:        "read_file",
		Runner:          "local",
		ResolvedSource:  "mcp:filesystem",
		Capability:      "filesystem_read",
		Allowed:         false,
		GuaranteeSource: "tool",
		Reason:          "guarantee_blocked",
		ProtocolVersion: 1,
		Time:            time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600)),
		Replica:         "replica-a",
		Sub:             "user-42",
		ChatID:          "chat-7",
		ChatType:        "direct",
		Tool:            "mcp:filesystem:read_file",
		Kind:            "mcp",
		Protocol:        "mcp/2025-06-18",
		Required:        "rye.execute.tool.mcp.filesystem.read_file",
		Layer:           "token",
		Explanation:     "no grant matches",
		CapabilityID:    "gog.email",
		Decision:        "deny",
		Gate:            "permissions",
		Code:            "permission_denied",
		Duration:        1234567 * time.Nanosecond,
		InputSHA256:     HashInput([]byte(`{"path":"/etc/passwd"}`)),
		RequestID:       fmt.Sprintf("req-%d", i),
		ApprovalID:      "appr-1",
		FlowID:          "flow-1",
		AccountRef:      "acct:github:1",
		Guarantees:      `{"runner":"local","keys":[{"key":"no_filesystem_read","source":"tool","enforced":true}]}`,
		Detail:          fmt.Sprintf("event %d", i),
	}
}

// appendEvent appends e as one line, without its newline.
func appendEvent(b []byte, e *Event, seq uint64, prev *[sha256.Size]byte) []byte {
	b, _, _ = appendLine(b, appendHead(nil, e), seq, appendTail(nil, e), prev)
	return b
}

func openT(t *testing.T, path string, opts Options) *Log {
	t.Helper()
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) == 0 {
		return nil
	}
	if data[len(data)-1] != '\n' {
		t.Fatalf("%s does not end with a newline", path)
	}
	return strings.Split(string(data[:len(data)-1]), "\n")
}

func writeLines(t *testing.T, path string, lines []string) {
	t.Helper()
	data := strings.Join(lines, "\n")
	if len(lines) > 0 {
		data += "\n"
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// keys returns the top-level keys of a JSON object in order.
func keys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v %v", tok, err)
	}
	var ks []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return ks
}

// logged writes events to a new log, closes it and returns the file's lines.
func logged(t *testing.T, events ...Event) (string, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{})
	for _, e := range events {
		l.Log(e)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path, readLines(t, path)
}

func TestKeyOrder(t *testing.T) {
	minimal := Event{Type: TypeCapabilityCheck, Time: time.Unix(1, 0)}
	toolCall := Event{Type: TypeToolCall, Sub: "u", Time: time.Unix(1, 0)}
	allowedCall := Event{Type: TypeToolCall, Allowed: true, Time: time.Unix(1, 0)}
	_, lines := logged(t, fullEvent(TypeCapabilityCheck, 1), minimal, toolCall, allowedCall)
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4", len(lines))
	}
	want := append(append([]string{}, traceKeys...), capgateKeys...)
	if got := keys(t, lines[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("full capability_check keys\n got %v\nwant %v", got, want)
	}
	if got, want := keys(t, lines[1]), []string{"type", "allowed", "time", "seq", "prev"}; !reflect.DeepEqual(got, want) {
		t.Errorf("minimal capability_check keys %v, want %v (allowed is always written)", got, want)
	}
	if got, want := keys(t, lines[2]), []string{"type", "time", "seq", "sub", "prev"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tool_call keys %v, want %v (allowed false is left out)", got, want)
	}
	if got, want := keys(t, lines[3]), []string{"type", "allowed", "time", "seq", "prev"}; !reflect.DeepEqual(got, want) {
		t.Errorf("allowed tool_call keys %v, want %v", got, want)
	}
	if !strings.HasPrefix(lines[0], `{"type":"capability_check","tool_name":"read_file","runner":"local",`) {
		t.Errorf("line starts %.80s", lines[0])
	}
}

func TestFieldValues(t *testing.T) {
	e := fullEvent(TypeCapabilityCheck, 3)
	_, lines := logged(t, e)
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type": "capability_check", "tool_name": "read_file", "runner": "local", "resolved_source": "mcp:filesystem",
		"capability": "filesystem_read", "allowed": false, "guarantee_source": "tool",
		"reason": "guarantee_blocked", "protocol_version": 1.0,
		"kind": "mcp", "protocol": "mcp/2025-06-18", "required": "rye.execute.tool.mcp.filesystem.read_file",
		"layer": "token", "explanation": "no grant matches", "capability_id": "gog.email",
		"time": "2026-03-01T11:00:00.123456789Z", "seq": 1.0, "replica": "replica-a", "sub": "user-42", "chat_id": "chat-7",
		"chat_type": "direct", "tool": "mcp:filesystem:read_file", "decision": "deny", "gate": "permissions",
		"code": "permission_denied", "duration_ms": 1.235, "input_sha256": e.InputSHA256, "request_id": "req-3",
		"approval_id": "appr-1", "flow_id": "flow-1", "account_ref": "acct:github:1", "detail": "event 3",
		"prev": genesis,
	}
	want["guarantees"] = map[string]any{"runner": "local", "keys": []any{
		map[string]any{"key": "no_filesystem_read", "source": "tool", "enforced": true}}}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("decoded\n%v\nwant\n%v", m, want)
	}
	if !strings.Contains(lines[0], `"protocol_version":1,`) {
		t.Errorf("protocol_version not written as the number 1: %s", lines[0])
	}
	if !strings.Contains(lines[0], `"duration_ms":1.235,`) {
		t.Errorf("duration not written with 3 decimals: %s", lines[0])
	}
}

func TestTimeDefaultsToNow(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	path := filepath.Join(t.TempDir(), "a.jsonl")
	l := openT(t, path, Options{Now: func() time.Time { return now }})
	l.Log(Event{Type: TypeAuthBegin})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if line := readLines(t, path)[0]; !strings.Contains(line, `"time":"2030-01-02T03:04:05.000000006Z"`) {
		t.Errorf("time not from Options.Now: %s", line)
	}
}

func TestHashInput(t *testing.T) {
	if got, want := HashInput([]byte("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("HashInput(abc) = %s, want %s", got, want)
	}
}

func TestEscaping(t *testing.T) {
	values := []string{
		`he said "hi"`, "two\nlines", "cr\rlf", "tab\tbed", `back\slash`, "nul\x00byte", "esc\x1b[31mred",
		"bell\a", "del\x7f", "c1\u009bcsi", "ls\u2028ps\u2029", "日本語 ✓ 😀", "</script>&", "\b\f\v",
		"\xff\xfe invalid", "",
	}
	for c := 0; c < 0x100; c++ {
		values = append(values, string(rune(c)))
	}
	var events []Event
	for _, v := range values {
		events = append(events, Event{Type: TypeToolCall, Detail: v, Sub: v + "x", Time: time.Unix(0, 0)})
	}
	_, lines := logged(t, events...)
	if len(lines) != len(values) {
		t.Fatalf("%d lines for %d events: an event spans lines", len(lines), len(values))
	}
	for i, v := range values {
		line := lines[i]
		for _, c := range []byte(line) {
			if c < 0x20 || c == 0x7f {
				t.Errorf("line %d holds raw control byte %#x: %q", i+1, c, line)
			}
		}
		for _, r := range line {
			if (r >= 0x80 && r <= 0x9f) || r == '\u2028' || r == '\u2029' {
				t.Errorf("line %d holds raw %U", i+1, r)
			}
		}
		var got struct {
			Detail *string `json:"detail"`
			Sub    string  `json:"sub"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		// encoding/json's reading of v: invalid bytes become U+FFFD each.
		var want string
		if err := json.Unmarshal(must(json.Marshal(v)), &want); err != nil {
			t.Fatal(err)
		}
		if v == "" {
			if got.Detail != nil {
				t.Errorf("empty detail written: %s", line)
			}
		} else if got.Detail == nil || *got.Detail != want {
			t.Errorf("line %d: detail decodes to %q, want %q", i+1, deref(got.Detail), want)
		}
		if got.Sub != want+"x" {
			t.Errorf("line %d: sub decodes to %q, want %q", i+1, got.Sub, want+"x")
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestChainConcurrent(t *testing.T) {
	const goroutines, each = 8, 250
	path := filepath.Join(t.TempDir(), "sub", "dir", "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Millisecond, MaxBatch: 32})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				e := fullEvent(TypeToolCall, i)
				e.Sub = fmt.Sprintf("g%d", g)
				e.Detail = fmt.Sprint(i)
				l.Log(e)
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lines != goroutines*each || !rep.Sidecar {
		t.Fatalf("report %+v, want %d lines and a sidecar", rep, goroutines*each)
	}
	lines := readLines(t, path)
	next := map[string]int{}
	prev := genesis
	for i, line := range lines {
		var v struct {
			Seq    int
			Sub    string
			Detail string
			Prev   string
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatal(err)
		}
		if v.Seq != i+1 {
			t.Fatalf("line %d has seq %d", i+1, v.Seq)
		}
		if v.Prev != prev {
			t.Fatalf("line %d prev %s, want %s", i+1, v.Prev, prev)
		}
		sum := sha256.Sum256([]byte(line))
		prev = hex.EncodeToString(sum[:])
		// Each goroutine's events stay in the order it logged them.
		if v.Detail != fmt.Sprint(next[v.Sub]) {
			t.Fatalf("line %d: %s event %s, want %d", i+1, v.Sub, v.Detail, next[v.Sub])
		}
		next[v.Sub]++
	}
	if rep.Head != prev {
		t.Errorf("report head %s, want %s", rep.Head, prev)
	}
	h, ok, err := readHead(path + ".head")
	if err != nil || !ok || h.seq != goroutines*each || h.hash != prev {
		t.Errorf("head sidecar %+v %v %v, want seq %d hash %s", h, ok, err, goroutines*each, prev)
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(path), 0o700 | os.ModeDir}, {path, 0o600}, {path + ".head", 0o600}} {
		if st, err := os.Stat(p.path); err != nil || st.Mode() != p.mode {
			t.Errorf("%s: mode %v (%v), want %v", p.path, st.Mode(), err, p.mode)
		}
	}
}

// tampered returns a fresh 10-event log's path and lines.
func tampered(t *testing.T) (string, []string) {
	t.Helper()
	events := make([]Event, 10)
	for i := range events {
		events[i] = fullEvent(TypeCapabilityCheck, i+1)
	}
	path, lines := logged(t, events...)
	if _, err := VerifyFile(path); err != nil {
		t.Fatalf("untouched log: %v", err)
	}
	return path, lines
}

func TestTamper(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(lines []string) []string
		line    int    // VerifyError.Line from VerifyFile
		msg     string // exact error of VerifyFile, after "<path>: "
		chainOK bool   // Verify (no sidecar) passes
	}{
		{"flip allowed", func(l []string) []string {
			l[4] = strings.Replace(l[4], `"allowed":false`, `"allowed":true`, 1)
			return l
		}, 6, "line 6: prev does not match line 5's hash: line 5 was edited, or a line was removed, inserted or reordered", false},
		{"change sub", func(l []string) []string {
			l[4] = strings.Replace(l[4], `"sub":"user-42"`, `"sub":"user-43"`, 1)
			return l
		}, 6, "line 6: prev does not match line 5's hash: line 5 was edited, or a line was removed, inserted or reordered", false},
		{"remove middle", func(l []string) []string {
			return append(l[:4], l[5:]...)
		}, 5, "line 5: seq is 6, want 5: 1 line(s) before it were removed, or lines were reordered", false},
		{"swap", func(l []string) []string {
			l[4], l[5] = l[5], l[4]
			return l
		}, 5, "line 5: seq is 6, want 5: 1 line(s) before it were removed, or lines were reordered", false},
		{"duplicate", func(l []string) []string {
			return append(l[:5], l[4:]...)
		}, 6, "line 6: seq is 5, want 6: a line was inserted or duplicated before it, or lines were reordered", false},
		{"remove first", func(l []string) []string {
			return l[1:]
		}, 1, "line 1: seq is 2, want 1: 1 line(s) before it were removed, or lines were reordered", false},
		{"edit first prev", func(l []string) []string {
			l[0] = strings.Replace(l[0], genesis, "1"+genesis[1:], 1)
			return l
		}, 1, "line 1: prev is not 64 zeros, as the first line's must be: the line was edited, or lines were removed from the start", false},
		{"truncate last", func(l []string) []string {
			return l[:9]
		}, 0, "truncated: audit.jsonl.head records 10 lines but the file has 9: line 10 and after were removed", true},
		{"truncate all", func(l []string) []string {
			return nil
		}, 0, "truncated: audit.jsonl.head records 10 lines but the file has 0: line 1 and after were removed", true},
		{"edit last", func(l []string) []string {
			l[9] = strings.Replace(l[9], `"decision":"deny"`, `"decision":"allow"`, 1)
			return l
		}, 10, "line 10: hash does not match audit.jsonl.head: line 10 was edited (it was the last line when the sidecar was written)", true},
		{"forged append", func(l []string) []string {
			forged := strings.Replace(l[9], `"seq":10`, `"seq":11`, 1)
			return append(l, forged)
		}, 11, "line 11: prev does not match line 10's hash: line 10 was edited, or a line was removed, inserted or reordered", false},
		{"bad json", func(l []string) []string {
			l[2] = l[2][:len(l[2])-1]
			return l
		}, 3, "line 3: not valid JSON: unexpected end of JSON input", false},
		{"empty line", func(l []string) []string {
			return append(l[:3], append([]string{""}, l[3:]...)...)
		}, 4, "line 4: empty line", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, lines := tampered(t)
			writeLines(t, path, tt.edit(lines))
			_, err := VerifyFile(path)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("VerifyFile: %v, want a *VerifyError", err)
			}
			if ve.Line != tt.line || ve.Path != path {
				t.Errorf("error at %s line %d, want %s line %d", ve.Path, ve.Line, path, tt.line)
			}
			if want := path + ": " + tt.msg; err.Error() != want {
				t.Errorf("error\n got %s\nwant %s", err, want)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = Verify(f)
			if tt.chainOK && err != nil {
				t.Errorf("Verify without the sidecar: %v; the chain alone should pass", err)
			}
			if !tt.chainOK {
				if err == nil || !strings.HasPrefix(tt.msg, err.Error()) {
					t.Errorf("Verify: %v, want %s", err, tt.msg)
				}
			}
			// Open refuses to extend a log cut back or edited at its end.
			if tt.name == "truncate last" || tt.name == "edit last" {
				if l, err := Open(path, Options{}); err == nil {
					l.Close()
					t.Errorf("Open extended a tampered log")
				}
			}
		})
	}
}

func TestIncompleteLastLine(t *testing.T) {
	path, lines := tampered(t)
	data := strings.Join(lines, "\n") + "\n" + lines[9][:40]
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := VerifyFile(path)
	if want := path + ": line 11: incomplete: the file ends without a newline (a write was cut short)"; err == nil || err.Error() != want {
		t.Errorf("VerifyFile: %v\nwant %s", err, want)
	}
	_, err = Open(path, Options{})
	if err == nil || !strings.Contains(err.Error(), path+":11: last line: incomplete") {
		t.Errorf("Open: %v, want %s:11: last line: incomplete", err, path)
	}
}

func TestOpenCorruptLastLine(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, last, want string
	}{
		{"garbage", "not json", ":3: last line: not valid JSON"},
		{"no seq", `{"type":"tool_call","prev":"` + genesis + `"}`, ":3: last line: no seq"},
		{"bad prev", `{"type":"tool_call","seq":3,"prev":"abc"}`, `:3: last line: prev "abc" is not 64 lowercase hex digits`},
		{"array", `[1,2]`, ":3: last line: not an audit record"},
		{"empty", ``, ":3: last line: empty line"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name+".jsonl")
			writeLines(t, path, []string{`{"seq":1}`, `{"seq":2}`, tt.last})
			_, err := Open(path, Options{})
			if err == nil || !strings.Contains(err.Error(), path+tt.want) {
				t.Errorf("Open: %v, want %s%s", err, path, tt.want)
			}
		})
	}
}

func TestReopenContinuesChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	total := 0
	for round := range 3 {
		l := openT(t, path, Options{})
		for i := range 5 + round {
			l.Log(fullEvent(TypeToolCall, i))
			total++
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lines != total || !rep.Sidecar {
		t.Errorf("report %+v, want %d lines", rep, total)
	}
	// Opening and closing without events leaves file and head alone.
	l := openT(t, path, Options{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep2, err := VerifyFile(path); err != nil || !reflect.DeepEqual(rep2, rep) {
		t.Errorf("after empty reopen: %+v %v, want %+v", rep2, err, rep)
	}
}

func TestCloseWritesEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// A long interval: only Close can have written these.
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	for i := range 100 {
		l.Log(fullEvent(TypeToolCall, i))
	}
	if got := len(readLinesMaybe(t, path)); got != 0 {
		t.Fatalf("%d lines written before Close with an hour's interval", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 100 {
		t.Fatalf("after Close: %+v %v, want 100 lines", rep, err)
	}
	l.Log(Event{Type: TypeToolCall})
	if l.Dropped() != 1 {
		t.Errorf("Dropped %d after a Log after Close, want 1", l.Dropped())
	}
	if err := l.Close(); err == nil {
		t.Errorf("second Close: no error")
	}
	if err := l.Flush(); err != nil {
		t.Errorf("Flush after Close: %v", err)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 100 {
		t.Errorf("after a Log after Close: %+v %v", rep, err)
	}
}

func readLinesMaybe(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

func TestFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	defer l.Close()
	for i := range 3 {
		l.Log(fullEvent(TypeApproval, i))
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyFile(path)
	if err != nil || rep.Lines != 3 || !rep.Sidecar {
		t.Errorf("after Flush: %+v %v, want 3 lines and a sidecar", rep, err)
	}
}

// The writer commits on its own within the interval: no Flush, no Close.
func TestBackgroundCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: 5 * time.Millisecond})
	defer l.Close()
	l.Log(fullEvent(TypeAuthComplete, 1))
	testkit.WaitFor(t, 10*time.Second, "the event to be written", func() bool { return len(readLinesMaybe(t, path)) > 0 })
}

func TestGroupCommit(t *testing.T) {
	const events = 1000
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{})
	for i := range events {
		l.Log(fullEvent(TypeToolCall, i))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	syncs := l.syncs.Load()
	t.Logf("%d events, %d fsyncs", events, syncs)
	if syncs == 0 || syncs > events/20 {
		t.Errorf("%d fsyncs for %d events, want between 1 and %d", syncs, events, events/20)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != events {
		t.Errorf("%+v %v", rep, err)
	}
}

func TestLogDuringClose(t *testing.T) {
	for round := range 20 {
		path := filepath.Join(t.TempDir(), fmt.Sprint(round, ".jsonl"))
		l := openT(t, path, Options{FlushInterval: time.Millisecond, MaxBatch: 8, MaxPending: 64})
		const goroutines, each = 8, 200
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				<-start
				for i := range each {
					l.Log(fullEvent(TypeToolCall, g*each+i))
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		rep, err := VerifyFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := uint64(rep.Lines) + l.Dropped(); got != goroutines*each {
			t.Fatalf("round %d: %d written + %d dropped = %d, want %d", round, rep.Lines, l.Dropped(), got, goroutines*each)
		}
	}
}

// failingFile fails writes after the first ok bytes, like a full disk.
type failingFile struct {
	*os.File
	ok       int
	truncErr error
}

func (f *failingFile) Write(p []byte) (int, error) {
	if len(p) <= f.ok {
		f.ok -= len(p)
		return f.File.Write(p)
	}
	n, _ := f.File.Write(p[:f.ok])
	f.ok = 0
	return n, errors.New("no space left on device")
}

func (f *failingFile) Truncate(size int64) error {
	if f.truncErr != nil {
		return f.truncErr
	}
	return f.File.Truncate(size)
}

// swapFile replaces the log's file, returning the old one.
func swapFile(l *Log, w writeTruncater) {
	l.iomu.Lock()
	defer l.iomu.Unlock()
	l.w = w
}

// pending counts the events logged but not yet written.
func pending(l *Log) int {
	l.wmu.Lock() // not in the middle of making lines
	defer l.wmu.Unlock()
	l.iomu.Lock() // nor of writing them
	defer l.iomu.Unlock()
	l.mu.Lock()
	n := l.queue.n
	l.mu.Unlock()
	l.omu.Lock()
	defer l.omu.Unlock()
	for _, c := range l.outbox {
		n += len(c.lines)
	}
	return n
}

// A write that fails keeps its events queued; a partial write is cut back;
// the events are written once the disk works again, with no gap in the
// chain.
func TestWriteErrorRetries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	l.Log(fullEvent(TypeToolCall, 0))
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	rw := l.f
	swapFile(l, &failingFile{File: rw, ok: 100}) // a partial line gets out
	// The writer waits until all five are queued: once it has failed, the
	// log is unhealthy with no space reserved, and later events are
	// counted rather than queued (checked below).
	l.wmu.Lock()
	for i := 1; i <= 5; i++ {
		l.Log(fullEvent(TypeToolCall, i))
	}
	l.wmu.Unlock()
	if err := l.Flush(); err == nil || !strings.Contains(err.Error(), "write: no space left on device") {
		t.Fatalf("Flush on a full disk: %v, want a write error", err)
	}
	if queued := pending(l); queued != 5 || l.Dropped() != 0 {
		t.Fatalf("after a failed write: %d pending, %d dropped; want 5 and 0", queued, l.Dropped())
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 1 {
		t.Fatalf("partial write not cut back: %+v %v", rep, err)
	}
	// The cut freed the space reserved past the end: an event no Ticket
	// covers is not queued while the log is unhealthy, but counted.
	l.Log(fullEvent(TypeToolCall, 99))
	if l.Unrecorded() != 1 {
		t.Fatalf("Unrecorded() = %d after logging on an unhealthy log with no space reserved", l.Unrecorded())
	}
	swapFile(l, rw)
	// The writer, woken by the first of the 5 events, may have failed on
	// its own after that Flush: its error is reported once, now.
	if err := l.Flush(); err != nil && !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Flush once the disk works: %v", err)
	}
	l.Log(fullEvent(TypeToolCall, 6))
	if err := l.Flush(); err != nil {
		t.Fatalf("second Flush once the disk works: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyFile(path)
	if err != nil || rep.Lines != 7 {
		t.Fatalf("%+v %v, want 7 lines", rep, err)
	}
	for i, line := range readLines(t, path) {
		if want := fmt.Sprintf(`"request_id":"req-%d"`, i); !strings.Contains(line, want) {
			t.Errorf("line %d lacks %s: events out of order", i+1, want)
		}
	}
}

// When a failed write cannot be cut back, the log stops writing rather than
// corrupt the chain, and counts what it drops.
func TestWriteErrorBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	l.Log(fullEvent(TypeToolCall, 0))
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	rw := l.f
	swapFile(l, &failingFile{File: rw, ok: 100, truncErr: errors.New("i/o error")})
	l.wmu.Lock() // one group: the writer waits until all five are queued
	for i := 1; i <= 5; i++ {
		l.Log(fullEvent(TypeToolCall, i))
	}
	l.wmu.Unlock()
	if err := l.Flush(); err == nil || !strings.Contains(err.Error(), "cutting back the partial write failed too") {
		t.Fatalf("Flush: %v", err)
	}
	swapFile(l, rw)
	l.Log(fullEvent(TypeToolCall, 6))
	if err := l.Flush(); err == nil || !strings.Contains(err.Error(), "not written") {
		t.Errorf("Flush after the log broke: %v", err)
	}
	l.Close()
	if l.Dropped() != 6 {
		t.Errorf("Dropped %d, want 6", l.Dropped())
	}
}

// Records that Close must drop, because the disk keeps failing them, were
// chained already: verify must not call the log intact without them.
func TestCloseDropsAreNotIntact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	l.Log(fullEvent(TypeToolCall, 0))
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	swapFile(l, &failingFile{File: l.f}) // every write fails whole
	for i := 1; i <= 3; i++ {
		l.Log(fullEvent(TypeToolCall, i))
	}
	if err := l.Close(); err == nil {
		t.Error("Close dropped records without an error")
	}
	if l.Dropped() != 3 {
		t.Errorf("Dropped %d, want 3", l.Dropped())
	}
	rep, err := VerifyFile(path)
	var ve *VerifyError
	if !errors.As(err, &ve) || !strings.Contains(ve.Reason, "truncated") {
		t.Fatalf("VerifyFile after dropped records = %+v, %v; want the log reported truncated", rep, err)
	}
	// Nor does a new Log carry on after the gap as if nothing was lost.
	if l2, err := Open(path, Options{}); err == nil {
		l2.Close()
		t.Error("Open extended a log that lost records")
	}
}

// At MaxPending, Log waits for the writer instead of dropping; Close
// releases waiters, which count their events as dropped.
func TestBackpressure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 4, MaxPending: 4})
	l.wmu.Lock() // the disk is stuck
	for i := range 4 {
		l.Log(fullEvent(TypeToolCall, i))
	}
	done := make(chan struct{})
	go func() {
		l.Log(fullEvent(TypeToolCall, 4))
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("Log did not wait at MaxPending")
	case <-time.After(20 * time.Millisecond):
	}
	l.wmu.Unlock()
	<-done
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 5 || l.Dropped() != 0 {
		t.Errorf("%+v %v dropped %d, want 5 lines none dropped", rep, err, l.Dropped())
	}
}

func TestVerifyEmptyAndLong(t *testing.T) {
	rep, err := Verify(strings.NewReader(""))
	if err != nil || rep.Lines != 0 || rep.Head != genesis {
		t.Errorf("empty: %+v %v", rep, err)
	}
	// A line longer than Verify's read buffer.
	e := fullEvent(TypeToolCall, 1)
	e.Detail = strings.Repeat("x", 200<<10)
	path, _ := logged(t, e, fullEvent(TypeToolCall, 2))
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 2 {
		t.Errorf("long line: %+v %v", rep, err)
	}
}

func TestTailFile(t *testing.T) {
	events := make([]Event, 30)
	for i := range events {
		events[i] = fullEvent(TypeToolCall, i)
	}
	path, lines := logged(t, events...)
	for _, n := range []int{0, 1, 5, 30, 100} {
		got, err := TailFile(path, n)
		if err != nil {
			t.Fatal(err)
		}
		k := min(n, len(lines))
		want := strings.Join(lines[len(lines)-k:], "\n")
		if k > 0 {
			want += "\n"
		}
		if string(got) != want {
			t.Errorf("tail %d: %d bytes, want %d", n, len(got), len(want))
		}
	}
	// An incomplete last line counts as a line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"partial`)
	f.Close()
	got, _ := TailFile(path, 2)
	if want := lines[29] + "\n" + `{"partial`; string(got) != want {
		t.Errorf("tail 2 with a partial line: %q", got)
	}
}

func TestTailStartChunks(t *testing.T) {
	// Lines straddling tailStart's 32 KiB read chunks.
	var b bytes.Buffer
	var lines []string
	for i := range 50 {
		l := strings.Repeat(string(rune('a'+i%26)), 1000*i+1)
		lines = append(lines, l)
		b.WriteString(l + "\n")
	}
	data := b.Bytes()
	for n := 1; n <= 50; n++ {
		start, err := tailStart(bytes.NewReader(data), int64(len(data)), n)
		if err != nil {
			t.Fatal(err)
		}
		got := bufio.NewScanner(bytes.NewReader(data[start:]))
		got.Buffer(nil, 1<<20)
		c := 0
		for got.Scan() {
			if got.Text() != lines[50-n+c] {
				t.Fatalf("n=%d: line %d wrong", n, c)
			}
			c++
		}
		if c != n {
			t.Fatalf("n=%d: %d lines", n, c)
		}
	}
	if _, err := tailStart(errReaderAt{}, 10, 1); err == nil {
		t.Error("read error not returned")
	}
}

type errReaderAt struct{}

func (errReaderAt) ReadAt([]byte, int64) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestSidecarCorrupt(t *testing.T) {
	path, _ := tampered(t)
	if err := os.WriteFile(path+".head", []byte("nonsense"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := VerifyFile(path)
	var ve *VerifyError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "not a head sidecar") {
		t.Errorf("VerifyFile with a corrupt sidecar: %v", err)
	}
	if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), "not a head sidecar") {
		t.Errorf("Open with a corrupt sidecar: %v", err)
	}
	// No sidecar: the chain is checked and the report says so.
	os.Remove(path + ".head")
	rep, err := VerifyFile(path)
	if err != nil || rep.Sidecar || rep.Lines != 10 {
		t.Errorf("without sidecar: %+v %v", rep, err)
	}
}

func TestDiscard(t *testing.T) {
	var s Sink = Discard
	s.Log(fullEvent(TypeToolCall, 1)) // must not panic
}

// checkString encodes s and checks that the result is one line of valid
// JSON, free of raw control characters, that decodes as encoding/json
// decodes its own encoding of s.
func checkString(t *testing.T, s string) {
	t.Helper()
	got := appendString(nil, s)
	for _, c := range got {
		if c < 0x20 || c == 0x7f {
			t.Fatalf("%q: raw byte %#x in %q", s, c, got)
		}
	}
	for _, r := range string(got) {
		if (r >= 0x80 && r <= 0x9f) || r == '\u2028' || r == '\u2029' {
			t.Fatalf("%q: raw %U in %q", s, r, got)
		}
	}
	var dec, want string
	if err := json.Unmarshal(got, &dec); err != nil {
		t.Fatalf("%q: %v: %s", s, err, got)
	}
	if err := json.Unmarshal(must(json.Marshal(s)), &want); err != nil {
		t.Fatal(err)
	}
	if dec != want {
		t.Fatalf("%q encodes to %s, which decodes to %q, want %q", s, got, dec, want)
	}
}

// Every special byte at every offset of a long string, so that the
// 8-bytes-at-a-time scan meets it in each lane.
func TestEscapingEveryLane(t *testing.T) {
	specials := []string{"\x00", "\x1f", "\n", `"`, `\`, "\x7f", "\x80", "\xff", "\u0085", "\u009b", "\u2028", "é", "😀", "\xe2\x80"}
	base := "abcdefghijklmnopqrstuvwxyz0123"
	for _, sp := range specials {
		for i := 0; i <= len(base); i++ {
			checkString(t, base[:i]+sp+base[i:])
		}
	}
	for c := 0; c < 0x100; c++ {
		checkString(t, strings.Repeat(string([]byte{byte(c)}), 17))
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain ascii text, long enough", "\"\\\n\t\x00\x7f", "\u2028\u0085日本😀", "\xff\xfe\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkString(t, s) })
}

// Two Logs on one file, as two capgate processes sharing a config have:
// each chains its lines to whatever the file ends with when it writes.
func TestTwoLogsOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	b := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	want := []string{}
	step := func(l *Log, name string, n int) {
		for i := range n {
			e := fullEvent(TypeToolCall, i)
			e.Detail = fmt.Sprintf("%s-%d", name, len(want))
			want = append(want, e.Detail)
			l.Log(e)
		}
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
		if rep, err := VerifyFile(path); err != nil || rep.Lines != len(want) || !rep.Sidecar {
			t.Fatalf("after %s wrote: %+v %v, want %d lines", name, rep, err, len(want))
		}
	}
	// Each step but the first two finds lines it did not write at the end.
	step(a, "a", 3)
	step(b, "b", 2) // b opened on an empty file
	step(a, "a", 1)
	step(a, "a", 2) // a wrote last: no rechaining
	step(b, "b", 4)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for i, line := range readLines(t, path) {
		if !strings.Contains(line, fmt.Sprintf(`"detail":%q`, want[i])) {
			t.Errorf("line %d: want detail %s: %s", i+1, want[i], line)
		}
	}
}

func TestTwoLogsOneFileConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const logs, goroutines, each = 3, 4, 300
	var ls []*Log
	for range logs {
		ls = append(ls, openT(t, path, Options{FlushInterval: time.Millisecond, MaxBatch: 16}))
	}
	var wg sync.WaitGroup
	for li, l := range ls {
		for g := range goroutines {
			wg.Go(func() {
				for i := range each {
					e := fullEvent(TypeToolCall, i)
					e.Sub = fmt.Sprintf("log%d-g%d", li, g)
					l.Log(e)
				}
			})
		}
	}
	wg.Wait()
	for _, l := range ls {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := VerifyFile(path)
	if err != nil || rep.Lines != logs*goroutines*each || !rep.Sidecar {
		t.Fatalf("%+v %v, want %d lines", rep, err, logs*goroutines*each)
	}
	count := map[string]int{}
	for _, line := range readLines(t, path) {
		var v struct{ Sub string }
		json.Unmarshal([]byte(line), &v)
		count[v.Sub]++
	}
	if len(count) != logs*goroutines {
		t.Errorf("%d writers in the file, want %d", len(count), logs*goroutines)
	}
	for sub, n := range count {
		if n != each {
			t.Errorf("%s: %d lines, want %d", sub, n, each)
		}
	}
}

// A file cut back behind a Log's back is not extended.
func TestCutBackWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{FlushInterval: time.Hour, MaxBatch: 1 << 20})
	defer l.Close()
	l.Log(fullEvent(TypeToolCall, 1))
	l.Log(fullEvent(TypeToolCall, 2))
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	writeLines(t, path, lines[:1])
	l.Log(fullEvent(TypeToolCall, 3))
	if err := l.Flush(); err == nil || !strings.Contains(err.Error(), "cut back") {
		t.Errorf("Flush after the file was cut back: %v", err)
	}
	if got := readLines(t, path); len(got) != 1 {
		t.Errorf("the cut-back file was extended to %d lines", len(got))
	}
}

// VerifyFile and TailFile read a log in use as of a moment between
// commits: a line half written under the lock is not seen.
func TestSnapshotWaitsForWriter(t *testing.T) {
	path, lines := tampered(t)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unlock, err := lockFile(f, lockEx)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(lines[0][:30]) // a write in progress
	done := make(chan error, 2)
	go func() { _, err := VerifyFile(path); done <- err }()
	go func() { _, err := TailFile(path, 1); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("read a log while it was locked for writing: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := f.Truncate(int64(len(strings.Join(lines, "\n")) + 1)); err != nil {
		t.Fatal(err)
	}
	unlock()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("after the writer unlocked: %v", err)
		}
	}
}

// rechain gives a chunk's lines exactly the bytes they would have had if
// they had been made on the new base.
func TestRechain(t *testing.T) {
	events := []Event{fullEvent(TypeToolCall, 1), {Type: TypeApproval, Time: time.Unix(5, 0)}, fullEvent(TypeCapabilityCheck, 3)}
	line := func(b []byte, e *Event, seq uint64, prev *[sha256.Size]byte) ([]byte, lineIdx) {
		start := len(b)
		b, ss, se := appendLine(b, appendHead(nil, e), seq, appendTail(nil, e), prev)
		*prev = sha256.Sum256(b[start:])
		b = append(b, '\n')
		return b, lineIdx{ss, se, len(b)}
	}
	c := &chunk{}
	var prev [sha256.Size]byte
	for i := range events {
		var li lineIdx
		c.buf, li = line(c.buf, &events[i], uint64(i+1), &prev)
		c.lines = append(c.lines, li)
	}
	base := sha256.Sum256([]byte("some other line"))
	rechain(c, 41, base, nil)

	var want []byte
	prev = base
	for i := range events {
		start := len(want)
		want = append(appendEvent(want, &events[i], uint64(42+i), &prev), '\n')
		prev = sha256.Sum256(want[start : len(want)-1])
	}
	if string(c.buf) != string(want) {
		t.Errorf("rechained:\n%s\nwant:\n%s", c.buf, want)
	}
	if c.seq != 44 || c.hash != prev || c.baseSeq != 41 || c.base != base {
		t.Errorf("chunk chain: seq %d base %d", c.seq, c.baseSeq)
	}
	for i, li := range c.lines {
		if got := string(c.buf[li.seqStart:li.seqEnd]); got != fmt.Sprint(42+i) {
			t.Errorf("line %d: seq digits %q", i+1, got)
		}
	}
}
