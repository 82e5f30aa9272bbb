package mcp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

const fixturePkg = testkit.MCPFixture

// echoSchema is the fixture's raw echo schema (internal/testkit/mcpfixture).
const echoSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","title":"Echo input","additionalProperties":false,"properties":{"message":{"type":"string","minLength":1}},"required":["message"]}`

func TestMain(m *testing.M) {
	testkit.Programs(testkit.ConformanceFixture, testkit.MCPFixture, testkit.TasksFixture)
	testkit.Main(m)
}

func stdioSource(t *testing.T, env map[string]string) *Source {
	t.Helper()
	return connect(t, Options{Name: "fx", Command: testkit.Build(t, fixturePkg), Env: env, Timeout: 10 * time.Second})
}

func httpFixture(t *testing.T, addr string) (kill func()) {
	t.Helper()
	return testkit.ServeMCPFixture(t, "-http", addr)
}

func freeAddr(t *testing.T) string { return testkit.FreeAddr(t) }

// urlSource connects to a fixture served over HTTP or SSE.
func urlSource(t *testing.T, url, transport string) *Source {
	t.Helper()
	return connect(t, Options{Name: "fx", URL: url, Transport: transport, Timeout: 10 * time.Second})
}

// connect makes a source of o, closed when the test ends, and connects it.
func connect(t *testing.T, o Options) *Source {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func find(t *testing.T, ds []*tool.Descriptor, name string) *tool.Descriptor {
	t.Helper()
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no tool %s among %d", name, len(ds))
	return nil
}

func checkCatalog(t *testing.T, s *Source) []*tool.Descriptor {
	t.Helper()
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 28 {
		t.Errorf("%d tools, want 28 (three pages of 10)", len(ds))
	}
	echo := find(t, ds, "echo")
	if string(echo.InputSchema) != echoSchema {
		t.Errorf("echo's schema was not passed through byte for byte:\n got %s\nwant %s", echo.InputSchema, echoSchema)
	}
	// The server's annotations are not trusted (no trust_annotations): echo's
	// readOnlyHint cannot lower it, so its words (none) leave it MED.
	if echo.ID != "mcp:fx:echo" || echo.Risk.Level != risk.Med || echo.Risk.LevelFrom != risk.FromInference {
		t.Errorf("echo: %+v", echo)
	}
	// mcp.NewTool's default annotations make slow look destructive: untrusted,
	// that raises it to MED at least, not HIGH.
	if slow := find(t, ds, "slow"); slow.Risk.Level != risk.Med {
		t.Errorf("slow risk %s, want MED", slow.Risk.Level)
	}
	return ds
}

func callEcho(t *testing.T, s *Source, echo *tool.Descriptor) {
	t.Helper()
	r, err := s.Call(context.Background(), tool.Call{Tool: echo, Input: json.RawMessage(`{"message":"hi"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Content) != 1 || !strings.Contains(string(r.Content[0]), `"echo: hi"`) || string(r.Structured) != `{"message":"hi"}` {
		t.Errorf("result %s / %s", r.Content, r.Structured)
	}
}

func TestStdio(t *testing.T) {
	s := stdioSource(t, nil)
	ds := checkCatalog(t, s)
	callEcho(t, s, find(t, ds, "echo"))
}

func TestStreamableHTTP(t *testing.T) {
	addr := freeAddr(t)
	httpFixture(t, addr)
	s := urlSource(t, "http://"+addr+"/mcp", "")
	ds := checkCatalog(t, s)
	callEcho(t, s, find(t, ds, "echo"))
}

func TestSSE(t *testing.T) {
	addr := freeAddr(t)
	testkit.ServeMCPFixture(t, "-sse", addr)
	s := urlSource(t, "http://"+addr+"/sse", "sse")
	ds := checkCatalog(t, s)
	callEcho(t, s, find(t, ds, "echo"))
}

func TestProgressAndCancellation(t *testing.T) {
	t.Run("stdio", func(t *testing.T) {
		cancelFile := filepath.Join(t.TempDir(), "cancelled")
		progressAndCancellation(t, stdioSource(t, map[string]string{"FIXTURE_CANCEL_FILE": cancelFile}), cancelFile)
	})
	t.Run("streamable-http", func(t *testing.T) {
		cancelFile := filepath.Join(t.TempDir(), "cancelled")
		t.Setenv("FIXTURE_CANCEL_FILE", cancelFile) // the fixture process inherits it
		addr := freeAddr(t)
		httpFixture(t, addr)
		progressAndCancellation(t, urlSource(t, "http://"+addr+"/mcp", ""), cancelFile)
	})
}

// progressAndCancellation relays progress in order, and a cancelled call
// reaches the upstream as notifications/cancelled.
func progressAndCancellation(t *testing.T, s *Source, cancelFile string) {
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slow := find(t, ds, "slow")
	var mu sync.Mutex
	var got []string
	_, err = s.Call(context.Background(), tool.Call{Tool: slow, Input: json.RawMessage(`{"delay_ms":20}`),
		Progress: func(p, total float64, msg string) {
			mu.Lock()
			got = append(got, msg)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if strings.Join(got, ",") != "step 1,step 2,step 3" {
		t.Errorf("progress %q", got)
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Call(ctx, tool.Call{Tool: slow, Input: json.RawMessage(`{"delay_ms":5000}`)}); err == nil {
		t.Fatal("a cancelled call succeeded")
	}
	testkit.WaitFor(t, 5*time.Second, "the upstream to see the cancellation", func() bool {
		b, err := os.ReadFile(cancelFile)
		return err == nil && string(b) == "cancelled"
	})
	// The connection survives a cancelled call.
	callEcho(t, s, find(t, ds, "echo"))
}

func TestListChanged(t *testing.T) {
	s := stdioSource(t, nil)
	changed := make(chan struct{}, 10)
	s.OnChange(func() { changed <- struct{}{} })
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Call(context.Background(), tool.Call{Tool: find(t, ds, "mutate")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no tools/list_changed reached the source's listeners")
	}
	ds, _ = s.List(context.Background())
	if d := find(t, ds, "echo"); d.Description != "Echo a message, and keep a copy" {
		t.Errorf("description %q after the change", d.Description)
	}
}

// TestReconnect kills the upstream: calls fail fast as unavailable; a
// restarted upstream comes back without touching the source.
func TestReconnect(t *testing.T) {
	addr := freeAddr(t)
	kill := httpFixture(t, addr)
	s, err := New(Options{Name: "fx", URL: "http://" + addr + "/mcp", Timeout: 5 * time.Second,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 10)
	s.OnChange(func() { changed <- struct{}{} })
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	echo := find(t, ds, "echo")
	kill()
	_, err = s.Call(context.Background(), tool.Call{Tool: echo, Input: json.RawMessage(`{"message":"x"}`)})
	if tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Fatalf("call to a dead upstream: %v", err)
	}
	start := time.Now()
	_, err = s.Call(context.Background(), tool.Call{Tool: echo, Input: json.RawMessage(`{"message":"x"}`)})
	if tool.ErrorCode(err) != tool.CodeBackendUnavailable || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("second call: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a call to a disconnected upstream took %v; it must fail fast", d)
	}
	httpFixture(t, addr)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-changed:
		case <-deadline:
			t.Fatal("the source did not reconnect to the restarted upstream")
		}
		if _, err := s.client(); err == nil {
			break
		}
	}
	callEcho(t, s, echo)
}

func TestUnreachableAtStart(t *testing.T) {
	addr := freeAddr(t)
	s, err := New(Options{Name: "fx", URL: "http://" + addr + "/mcp", Timeout: 2 * time.Second,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Connect(context.Background()); err == nil {
		t.Fatal("connected to nothing")
	}
	if _, err := s.List(context.Background()); tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Errorf("list while unreachable: %v", err)
	}
	changed := make(chan struct{}, 10)
	s.OnChange(func() { changed <- struct{}{} })
	httpFixture(t, addr)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("never connected once the upstream came up")
	}
	checkCatalog(t, s)
}

// The two benchmarks below call the same stdio upstream's echo: directly
// with an mcp-go client, and through this source. Their ratio is the
// latency the source adds.

func BenchmarkCallDirect(b *testing.B) {
	c, err := client.NewStdioMCPClient(testkit.Build(b, fixturePkg), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = Protocol
	if _, err := c.Initialize(context.Background(), init); err != nil {
		b.Fatal(err)
	}
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "echo"
	req.Params.Arguments = json.RawMessage(`{"message":"hi"}`)
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.CallTool(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallSource(b *testing.B) {
	s, err := New(Options{Name: "fx", Command: testkit.Build(b, fixturePkg)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Connect(context.Background()); err != nil {
		b.Fatal(err)
	}
	ds, err := s.List(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var echo *tool.Descriptor
	for _, d := range ds {
		if d.Name == "echo" {
			echo = d
		}
	}
	call := tool.Call{Tool: echo, Input: json.RawMessage(`{"message":"hi"}`)}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Call(context.Background(), call); err != nil {
			b.Fatal(err)
		}
	}
}

// readResult, the hot path's reading of a tools/call response, must read
// every response it takes as decodeResult (encoding/json) does.
func TestReadResultMatchesDecodeResult(t *testing.T) {
	for _, raw := range []string{
		`{"jsonrpc":"2.0","id":"capgate-1","result":{"content":[{"type":"text","text":"ok"}]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"n":12345678901234567},"isError":true}}`,
		` {"result" : {"content" : [ {"type":"image","data":"aGk="} , {"type":"text","text":"a\"b"} ] , "isError":false } } `,
		`{"result":{"content":null,"structuredContent":null,"isError":null}}`,
		`{"result":{}}`,
		`{"result":{"structuredContent":[1,2]}}`,
		`{"result":{"content":[{"type":"text","text":"é"}],"_meta":{"x":1}}}`,
	} {
		got, ok := readResult([]byte(raw))
		if !ok {
			t.Errorf("readResult refused %s", raw)
			continue
		}
		want, rpcErr, err := decodeResult([]byte(raw))
		if err != nil || rpcErr != nil || want == nil {
			t.Fatalf("decodeResult(%s) = %v, %v, %v", raw, want, rpcErr, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\nreadResult   %+v\ndecodeResult %+v", raw, got, want)
		}
	}
	// What it does not take, decodeResult reads: errors, no result, odd
	// documents, wrong types.
	for _, raw := range []string{
		`{"error":{"code":-32602,"message":"no"}}`,
		`{"result":null}`, `{"result":{"content":[]},"error":null}`,
		`{"result":{"content":{}}}`, `{"result":{"isError":"yes"}}`,
		`{"Result":{"content":[]}}`, `{"result":{"content":[]},"result":{"content":[]}}`,
		`{"result":{"content":[1,]}}`, `not json`,
	} {
		if out, ok := readResult([]byte(raw)); ok {
			t.Errorf("readResult took %s: %+v", raw, out)
		}
	}
}

// TestListChangedStateless: an upstream on the stateless protocol
// announces a changed tool list on the subscriptions/listen stream the
// source keeps open, which refreshes the catalog as on a session.
func TestListChangedStateless(t *testing.T) {
	addr := freeAddr(t)
	httpFixture(t, addr)
	s := connected(t, Options{URL: "http://" + addr + "/mcp"})
	if l, err := s.client(); err != nil || !l.modern() {
		t.Fatalf("the fixture over HTTP: %v, want the stateless protocol", err)
	}
	changed := make(chan struct{}, 10)
	s.OnChange(func() { changed <- struct{}{} })
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The stream is opened in the background: mutate until it is heard.
	testkit.WaitFor(t, 20*time.Second, "tools/list_changed from the stateless upstream", func() bool {
		if _, err := s.Call(context.Background(), tool.Call{Tool: find(t, ds, "mutate")}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			return true
		case <-time.After(500 * time.Millisecond):
			return false
		}
	})
	ds, _ = s.List(context.Background())
	if d := find(t, ds, "echo"); d.Description != "Echo a message, and keep a copy" {
		t.Errorf("description %q after the change", d.Description)
	}
}
