package server

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

func TestMain(m *testing.M) {
	testkit.Programs(testkit.ConformanceFixture, testkit.HeadersFixture, testkit.MCPFixture)
	testkit.Main(m)
}

const testSecret = "server-test-secret-abcdef0123456789"

// setup is what a test's Server fronts, built as app.Open builds it from
// a config: a registry over real sources (or over sources, when set), a
// SQLite store, an audit file, the built-in risk table, the grants and the
// skills of workspace (the temp dir when "").
type setup struct {
	registry  sources.BuildOptions
	sources   []tool.Source
	grants    []string
	workspace string
	logger    *slog.Logger
}

// testServer is a Server with the parts it fronts.
type testServer struct {
	*Server
	Store     *store.Store
	Audit     *audit.Log
	auditPath string
}

// fixtureServer is the MCP fixture as upstream fx, with the risk of the
// tools the tests call set to LOW.
func fixtureServer(t testing.TB) sources.MCPServer {
	return sources.MCPServer{
		Options: srcmcp.Options{Name: "fx", Command: testkit.Build(t, testkit.MCPFixture)}, Prefix: "fx",
		Tools: map[string]registry.Override{"echo": {Level: risk.Low}, "slow": {Level: risk.Low}, "t_00": {Level: risk.Low}},
	}
}

// open starts a Server over the MCP fixture, served on a real loopback
// listener.
func open(t *testing.T) (*testServer, string) {
	t.Helper()
	return serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{fixtureServer(t)}},
		grants:   []string{"rye.fetch.tool.mcp.fx.*", "rye.execute.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.slow"},
	})
}

// serveSetup builds su's parts and serves them on a loopback listener; it
// returns the server and its URL.
func serveSetup(t testing.TB, su setup) (*testServer, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	secret := token.ParseSecret(testSecret)
	s := &testServer{auditPath: filepath.Join(dir, "audit.jsonl")}
	var (
		reg *registry.Registry
		err error
	)
	if su.sources != nil {
		reg, err = registry.New(ctx, su.sources, registry.Options{})
	} else {
		bo := su.registry
		bo.BridgeKey = func(ns string) ([]byte, error) { return token.BridgeKey(secret, ns) }
		reg, err = sources.Build(ctx, bo)
	}
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); reg.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-ran; reg.Close() })
	if s.Store, err = store.Open(ctx, filepath.Join(dir, "data"), store.Options{Key: make([]byte, 32)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Store.Close() })
	if s.Audit, err = audit.Open(s.auditPath, audit.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Audit.Close() })
	verifier, err := token.NewVerifier(token.Options{Secret: secret, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	table, err := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Options{Registry: reg, Verifier: verifier, Risk: table, Policy: router.Policy{Grants: su.grants},
		State: s.Store, Audit: s.Audit, Secret: secret, Logger: su.logger})
	if err != nil {
		t.Fatal(err)
	}
	s.Server = New(Options{Router: r, Registry: reg, Logger: su.logger})
	if su.workspace == "" {
		su.workspace = dir
	}
	if err := s.LoadSkills(skills.Options{Workspace: su.workspace}, nil); err != nil {
		t.Fatal(err)
	}
	return s, listen(t, s.Server)
}

// listen serves s as capgate serve does (its own HTTP/1.1 loop for /mcp,
// net/http for the rest) on a loopback port, until the test ends.
func listen(t testing.TB, s *Server) string {
	t.Helper()
	s.listen, s.socket = "127.0.0.1:0", "-"
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, func(a, _ string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	return ""
}

func mint(t testing.TB, c token.Claims) string {
	t.Helper()
	s, err := token.Mint(token.ParseSecret(testSecret), c, token.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// connect opens an MCP session on url with tok. A client given handlers
// for the server's requests (sampling, elicitation) also opens, on
// 2025-11-25, the standalone GET stream where mcp-go's server sends
// sampling requests, and says it can sample with tools.
func connect(t *testing.T, url, tok, protocol string, handlers ...client.ClientOption) *client.Client {
	t.Helper()
	var caps mcp.ClientCapabilities
	if len(handlers) > 0 {
		caps.Sampling = &mcp.SamplingCapability{Tools: &struct{}{}}
	}
	return connectCaps(t, url, tok, protocol, caps, handlers...)
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestMCPFrontDoor(t *testing.T) {
	_, url := open(t)
	for _, protocol := range []string{"", "2025-11-25"} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			ctx := context.Background()
			c := connect(t, url, mint(t, token.Claims{Sub: "alice"}), protocol)
			tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]mcp.Tool{}
			for _, tl := range tools.Tools {
				names[tl.Name] = tl
			}
			echo, ok := names["fx__echo"]
			if len(names) != 28 || !ok || names["fx__mutate"].Name == "" {
				t.Fatalf("tools: %d %v", len(names), names)
			}
			if echo.Meta == nil || echo.Meta.AdditionalFields["capgate/tool_id"] != "mcp:fx:echo" || echo.Meta.AdditionalFields["capgate/risk"] != "LOW" ||
				echo.Annotations.ReadOnlyHint == nil || !*echo.Annotations.ReadOnlyHint || *echo.Annotations.DestructiveHint {
				t.Errorf("echo as listed: %+v %+v", echo.Meta, echo.Annotations)
			}
			call := func(name string, args map[string]any) *mcp.CallToolResult {
				req := mcp.CallToolRequest{}
				req.Params.Name, req.Params.Arguments = name, args
				r, err := c.CallTool(ctx, req)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return r
			}
			if r := call("fx__echo", map[string]any{"message": "hi"}); r.IsError || resultText(r) != "echo: hi" {
				t.Errorf("echo: %+v", r)
			}
			r := call("fx__t_00", nil)
			if !r.IsError || !strings.Contains(resultText(r), "permission_denied") || !strings.Contains(resultText(r), "required: rye.execute.tool.mcp.fx.t_00") ||
				!strings.Contains(resultText(r), "to allow it:") {
				t.Errorf("denied: %+v", resultText(r))
			}
			if r := call("fx__echo", map[string]any{"message": 3}); !r.IsError || !strings.Contains(resultText(r), "input.message") {
				t.Errorf("invalid input: %s", resultText(r))
			}
			// Progress is passed through from the upstream.
			var mu sync.Mutex
			var progress []float64
			c.OnNotification(func(n mcp.JSONRPCNotification) {
				if n.Method == "notifications/progress" {
					mu.Lock()
					progress = append(progress, n.Params.AdditionalFields["progress"].(float64))
					mu.Unlock()
				}
			})
			req := mcp.CallToolRequest{}
			req.Params.Name, req.Params.Arguments = "fx__slow", map[string]any{"delay_ms": 5}
			req.Params.Meta = &mcp.Meta{ProgressToken: "p1"}
			res, err := c.CallTool(ctx, req)
			if err != nil || resultText(res) != "done" {
				t.Fatalf("slow: %v %+v", err, res)
			}
			testkit.Poll(2*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(progress) >= 3 })
			mu.Lock()
			// mcp-go v1.2.1 may drop a notification sent just before the
			// result; the ones that arrive must be in order.
			if len(progress) < 2 || !slices.IsSorted(progress) {
				t.Errorf("progress %v", progress)
			}
			mu.Unlock()
		})
	}
}

// A caller sees only what it may fetch, and its token narrows it.
func TestMCPVisibility(t *testing.T) {
	_, url := open(t)
	c := connect(t, url, mint(t, token.Claims{Sub: "bob", Caps: []string{"rye.fetch.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.echo"}}), "")
	tools, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 1 || tools.Tools[0].Name != "fx__echo" {
		t.Errorf("narrowed list: %v", tools.Tools)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = "fx__t_00"
	_, err = c.CallTool(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a hidden tool is not found: %v", err)
	}
}

func TestMCPUnauthorized(t *testing.T) {
	_, url := open(t)
	for _, auth := range []string{"", "Bearer nope", "Bearer " + mint(t, token.Claims{Sub: "x", ExpiresAt: time.Now().Add(-time.Hour), IssuedAt: time.Now().Add(-2 * time.Hour)})} {
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		www := resp.Header.Get("WWW-Authenticate")
		if resp.StatusCode != 401 || !strings.Contains(www, `resource_metadata="http://`) || !strings.Contains(www, metadataPath) {
			t.Errorf("%q: %d %q", auth, resp.StatusCode, www)
		}
		if auth != "" && strings.Contains(www, strings.TrimPrefix(auth, "Bearer ")) {
			t.Errorf("the challenge echoes the token")
		}
	}
	resp, err := http.Get(url + metadataPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	if resp.StatusCode != 200 || !strings.Contains(b.String(), `"resource":"`+url+`/mcp"`) {
		t.Errorf("metadata: %d %s", resp.StatusCode, b.String())
	}
}

// A session opened by alice cannot be used with bob's token.
func TestMCPSessionBoundToSubject(t *testing.T) {
	_, url := open(t)
	_, other := open(t) // another process, as after a restart
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	modernList := `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	send := func(url, method, tok, sid, version, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+tok)
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		if version != "" {
			req.Header.Set("Mcp-Protocol-Version", version)
		}
		if version == "2026-07-28" {
			req.Header.Set("Mcp-Method", "tools/list")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	alice, bob := mint(t, token.Claims{Sub: "alice"}), mint(t, token.Claims{Sub: "bob"})
	resp := send(url, "POST", alice, "", "", init)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || !strings.HasPrefix(sid, "cg-") {
		t.Fatalf("initialize: %d %q", resp.StatusCode, sid)
	}
	if r := send(url, "POST", alice, sid, "2025-11-25", list); r.StatusCode != 200 {
		t.Errorf("alice on her session: %d", r.StatusCode)
	}
	if r := send(url, "GET", alice, sid, "2025-11-25", ""); r.StatusCode != 200 || r.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("alice's GET stream on her session: %d %q", r.StatusCode, r.Header.Get("Content-Type"))
	}
	forged := sid[:len(sid)-1] + "0"
	if strings.HasSuffix(sid, "0") {
		forged = sid[:len(sid)-1] + "1"
	}
	// Refused with 404, on which a client opens a new session.
	for _, tc := range []struct{ name, url, method, tok, sid, body string }{
		{"bob on alice's session", url, "POST", bob, sid, list},
		{"bob's GET stream on alice's session", url, "GET", bob, sid, ""},
		{"bob ending alice's session", url, "DELETE", bob, sid, ""},
		{"a forged id", url, "POST", alice, forged, list},
		{"mcp-go's own id format", url, "POST", alice, "mcp-session-9b2ed7a5-1c1d-4c5e-a5b5-3a8f5a1e2c3d", list},
		{"alice's id on another capgate", other, "POST", alice, sid, list},
	} {
		if r := send(tc.url, tc.method, tc.tok, tc.sid, "2025-11-25", tc.body); r.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", tc.name, r.StatusCode)
		}
	}
	if r := send(url, "POST", alice, sid, "2025-11-25", list); r.StatusCode != 200 {
		t.Errorf("alice's session after bob's attempts: %d", r.StatusCode)
	}
	// Protocol 2026-07-28 has no sessions: a stray header changes nothing.
	if r := send(url, "POST", bob, sid, "2026-07-28", modernList); r.StatusCode != 200 {
		t.Errorf("a 2026-07-28 request with a stray session id: %d", r.StatusCode)
	}
}
