package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
)

func TestMain(m *testing.M) {
	// The suite's runs, the reference server and the replicas mostly wait
	// (on the suite's timers, on answers): two at a time left the cores idle.
	testkit.WaitParallel(6)
	testkit.Programs(testkit.CapgatePkg, Fixture, testkit.HeadersFixture, testkit.HeadersClient, testkit.TasksFixture)
	testkit.Main(m)
}

// TestConformanceFixture runs the MCP conformance suite against the fixture
// and holds the results to baseline.json.
func TestConformanceFixture(t *testing.T) {
	if testing.Short() {
		t.Skip("the conformance suite runs Node; skipped with -short")
	}
	t.Parallel()
	Install(t) // first: without npm, skip (or fail in CI) before building anything
	results, err := directFixtureRun(t)
	if err != nil {
		t.Fatal(err)
	}
	baseline, err := FixtureBaseline()
	if err != nil {
		t.Fatal(err)
	}
	if problems := baseline.Check(results); len(problems) > 0 {
		t.Errorf("the conformance suite against the fixture does not match internal/conformance/baseline.json (%s):\n%s",
			Summary(results), strings.Join(problems, "\n"))
	}
}

// fixtureRun is the suite's run against the fixture directly: held to
// baseline.json by TestConformanceFixture, and what
// TestConformanceThroughCapgate compares capgate's run with. One run
// serves both (a run takes many seconds).
var fixtureRun struct {
	once    sync.Once
	results map[string]Result
	err     error
}

// directFixtureRun runs the suite against a fixture of its own, once per
// test binary, and returns that run's results to every caller.
func directFixtureRun(t *testing.T) (map[string]Result, error) {
	t.Helper()
	fixtureRun.once.Do(func() {
		fixtureRun.err = errors.New("the suite's run against the fixture failed in another test")
		url := StartFixture(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		fixtureRun.results, fixtureRun.err = Run(ctx, t, url)
	})
	return fixtureRun.results, fixtureRun.err
}

// TestConformanceFixtureModern drives the fixture with mcp-go's client, which
// speaks protocol 2026-07-28 (what capgate speaks upstream), and checks the
// behaviours the suite checks over 2025-11-25: progress, logging, and
// sampling and elicitation as multi round-trip input requests.
func TestConformanceFixtureModern(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the fixture; skipped with -short")
	}
	t.Parallel()
	url := StartFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var sampled, elicited []string
	var mu sync.Mutex
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	client.WithSamplingHandler(samplerFunc(func(_ context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(req.Messages)
		sampled = append(sampled, string(b))
		return &mcp.CreateMessageResult{
			SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("sampled answer")},
			Model:           "test-model", StopReason: "endTurn",
		}, nil
	}))(c)
	client.WithElicitationHandler(elicitorFunc(func(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
		mu.Lock()
		defer mu.Unlock()
		elicited = append(elicited, req.Params.Message)
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
			Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"username": "testuser", "email": "test@example.com"},
		}}, nil
	}))(c)
	var notes []mcp.JSONRPCNotification
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		mu.Lock()
		defer mu.Unlock()
		notes = append(notes, n)
	})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "conformance-modern", Version: "1.0.0"}
	res, err := c.Initialize(ctx, init)
	if err != nil {
		t.Fatal(err)
	}
	if !mcp.IsModernProtocol(res.ProtocolVersion) {
		t.Errorf("negotiated %s, want the stateless protocol (2026-07-28 or later)", res.ProtocolVersion)
	}
	var level mcp.SetLevelRequest
	level.Params.Level = mcp.LoggingLevelDebug
	if err := c.SetLevel(ctx, level); err != nil {
		t.Fatal(err)
	}

	call := func(name string, args map[string]any, meta *mcp.Meta) string {
		t.Helper()
		var req mcp.CallToolRequest
		req.Params.Name = name
		req.Params.Arguments = args
		req.Params.Meta = meta
		r, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.IsError || len(r.Content) == 0 {
			t.Fatalf("%s: %+v", name, r)
		}
		text, _ := r.Content[0].(mcp.TextContent)
		return text.Text
	}
	count := func(method string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, note := range notes {
			if note.Method == method {
				n++
			}
		}
		return n
	}

	if got := call("test_sampling", map[string]any{"prompt": "Test prompt"}, nil); got != "LLM response: sampled answer" {
		t.Errorf("test_sampling = %q", got)
	}
	if len(sampled) != 1 || !strings.Contains(sampled[0], "Test prompt") {
		t.Errorf("sampling requests = %q, want one with the prompt", sampled)
	}
	if got := call("test_elicitation", map[string]any{"message": "Who are you?"}, nil); !strings.Contains(got, "action=accept") || !strings.Contains(got, "testuser") {
		t.Errorf("test_elicitation = %q", got)
	}
	if len(elicited) != 1 || elicited[0] != "Who are you?" {
		t.Errorf("elicitation requests = %q", elicited)
	}

	call("test_tool_with_progress", nil, &mcp.Meta{ProgressToken: "p-1"})
	call("test_tool_with_logging", nil, nil)
	testkit.Poll(30*time.Second, func() bool { return count("notifications/progress") >= 3 && count("notifications/message") >= 3 })
	if n := count("notifications/progress"); n != 3 {
		t.Errorf("got %d progress notifications, want 3", n)
	}
	if n := count("notifications/message"); n != 3 {
		t.Errorf("got %d log notifications, want 3", n)
	}
}

type samplerFunc func(context.Context, mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error)

func (f samplerFunc) CreateMessage(ctx context.Context, req mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
	return f(ctx, req)
}

type elicitorFunc func(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error)

func (f elicitorFunc) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	return f(ctx, req)
}

// TestConformanceFixtureStdio checks that the fixture serves stdio without
// flags.
func TestConformanceFixtureStdio(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the fixture; skipped with -short")
	}
	t.Parallel()
	cmd := exec.Command(testkit.Build(t, Fixture))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	} {
		if _, err := stdin.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the fixture closed stdout before answering tools/list")
			}
			var msg struct {
				ID     int `json:"id"`
				Result struct {
					Tools []struct{ Name string } `json:"tools"`
				} `json:"result"`
			}
			if json.Unmarshal([]byte(line), &msg) != nil || msg.ID != 2 {
				continue
			}
			var names []string
			for _, tool := range msg.Result.Tools {
				names = append(names, tool.Name)
			}
			for _, want := range []string{"test_simple_text", "test_sampling", "json_schema_2020_12_tool"} {
				if !strings.Contains(strings.Join(names, " "), want) {
					t.Errorf("tools/list over stdio lacks %s: %v", want, names)
				}
			}
			return
		case <-timeout:
			t.Fatal("no tools/list answer over stdio")
		}
	}
}

func TestConformanceParseRun(t *testing.T) {
	out := t.TempDir()
	write := func(dir, checks string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(out, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, dir, "checks.json"), []byte(checks), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("server-ping-2026-11-22T06-28-25-169Z", `[{"id":"ping","name":"Ping","description":"d","status":"SUCCESS"}]`)
	write("server-tools-call-with-progress-2026-11-22T06-28-25-710Z",
		`[{"id":"p","name":"ToolsCallWithProgress","description":"d","status":"FAILURE","errorMessage":"got 2"}]`)
	write("server-server-sse-polling-2026-11-22T06-28-25-908Z",
		`[{"id":"i","name":"I","status":"INFO"},{"id":"w","name":"W","status":"WARNING","errorMessage":"no priming"}]`)
	write("server-server-sse-multiple-streams-2026-11-22T06-28-26-021Z", `[{"id":"i","name":"I","status":"INFO"}]`)
	stdout := "Running all suite (6 scenarios) against http://x/mcp\n\n" +
		"=== Running scenario: ping ===\n" +
		"=== Running scenario: tools-call-with-progress ===\n" +
		"=== Running scenario: server-sse-polling ===\n" +
		"=== Running scenario: server-sse-multiple-streams ===\n" +
		"=== Running scenario: threw ===\nFailed to run scenario threw: Error: boom\n" +
		"=== Running scenario: vanished ===\n" +
		"\n\n=== SUMMARY ===\n\x1b[32m✓ ping: 1 passed, 0 failed\x1b[0m\n✗ threw: 0 passed, 1 failed\n\nTotal: 1 passed, 2 failed\n"
	results, err := parseRun(stdout, out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"ping": true, "tools-call-with-progress": false, "server-sse-polling": false,
		"server-sse-multiple-streams": true, "threw": false, "vanished": false}
	if len(results) != len(want) {
		t.Errorf("got scenarios %v, want %v", Names(results), want)
	}
	for name, ok := range want {
		r, found := results[name]
		if !found || r.OK() != ok {
			t.Errorf("%s: found=%v OK=%v, want OK=%v (%+v)", name, found, r.OK(), ok, r)
		}
	}
	if p := results["tools-call-with-progress"].Problems(); len(p) != 1 || !strings.Contains(p[0], "got 2") {
		t.Errorf("problems = %q", p)
	}
	if got := Summary(results); got != "6 scenarios: 2 passed, 4 failed; checks: 1 passed, 3 failed, 1 warnings" {
		t.Errorf("Summary = %q", got)
	}
	if _, err := parseRun("nothing", t.TempDir()); err == nil {
		t.Error("parseRun of a run with no scenario: no error")
	}
}

func TestConformanceBaseline(t *testing.T) {
	if _, err := FixtureBaseline(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`{"suite":"x","scenarios":{"a":{"expect":"fail"}}}`,
		`{"suite":"x","scenarios":{"a":{"expect":"maybe"}}}`,
		`{"suite":"x","scenarios":{"a":{"expect":"either"}}}`,
		`{"suite":"x","scenarios":{}}`,
		`{"suite":"x","scenarios":{"a":{"expect":"pass"}},"extra":1}`,
	} {
		if _, err := ParseBaseline([]byte(bad)); err == nil {
			t.Errorf("ParseBaseline(%s): no error", bad)
		}
	}
	bl, err := ParseBaseline([]byte(`{"suite":"x","scenarios":{
		"ok":{"expect":"pass"}, "broken":{"expect":"pass"},
		"known":{"expect":"fail","reason":"upstream bug"}, "fixed":{"expect":"fail","reason":"was broken"},
		"gone":{"expect":"pass"},
		"racy":{"expect":"either","reason":"a race"}, "racy2":{"expect":"either","reason":"a race"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	pass := Result{Passed: 1}
	fail := Result{Failed: 1, Checks: []Check{{Name: "X", Status: "FAILURE", ErrorMessage: "nope"}}}
	problems := bl.Check(map[string]Result{"ok": pass, "broken": fail, "known": fail, "fixed": pass, "new": pass,
		"racy": pass, "racy2": fail})
	joined := strings.Join(problems, "\n")
	for _, want := range []string{"broken: unexpected failure", "nope", "fixed: unexpected pass", "new: not in the baseline", "gone: in the baseline but the suite did not run it"} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems lack %q:\n%s", want, joined)
		}
	}
	if len(problems) != 4 {
		t.Errorf("got %d problems, want 4:\n%s", len(problems), joined)
	}

	direct := map[string]Result{"a": pass, "b": pass, "c": pass}
	if d := Compare(direct, map[string]Result{"a": pass, "b": pass, "c": pass}); d != nil {
		t.Errorf("Compare of equal runs = %q", d)
	}
	d := Compare(direct, map[string]Result{"a": pass, "b": fail, "d": pass})
	if len(d) != 3 || !strings.HasPrefix(d[0], "b: directly passed") || !strings.HasPrefix(d[1], "c: ran only directly") || !strings.HasPrefix(d[2], "d: ran only through") {
		t.Errorf("Compare = %q", d)
	}
}
