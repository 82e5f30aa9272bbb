package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
)

// The secrets the hostile upstreams try to get past capgate: the MCP
// fixture's (-hostile), the bridge fixture's and the extension's below.
const (
	mcpSecret    = "hx-SECRET-4f1c9e27"
	bridgeSecret = "ya29.bridge-SECRET-8c2d41"
	extSecret    = "ext-SECRET-b71e0a"
)

// startHostile runs capgate serve in front of the hostile MCP fixture
// (operator risk LOW for all its tools, side_effects = [] for quiet), the
// bridge fixture and an extension pack whose command dies printing a
// secret. It returns the server and a reader of its log.
func startHostile(t *testing.T) (*served, func() string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	pack := filepath.Join(t.TempDir(), "packs", "leaky")
	manifest := `id: tools.leaky
commands:
  crash:
    description: Die printing a credential
    run: ["sh", "-c", "echo 'fatal: login with password=` + extSecret + ` refused' >&2; exit 3"]
    risk: LOW
`
	writeFile(t, filepath.Join(pack, "extension.yaml"), manifest)
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Socket: true, Secret: "hostile-test-secret-value-3a9b7c", Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.hx.*", "rye.execute.tool.bridge.gog.*", "rye.execute.tool.ext.tools.leaky.*"]

[extensions]
paths = [%q]

[capabilities.providers.gog]
command = [%q]

[mcp.servers.hx]
command = %q
args = ["-hostile"]
risk = "LOW"

[mcp.servers.hx.tools.quiet]
risk = "LOW"
side_effects = []
`, filepath.Dir(pack), testkit.Build(t, testkit.BridgeFixture), testkit.Build(t, testkit.MCPFixture))}))
	return s, s.logs
}

// hostileClients are real MCP clients of s: over streamable HTTP, through
// `capgate connect`, and of `capgate serve --stdio` on s's config (mcp-go's
// path).
func hostileClients(t *testing.T, s *served) map[string]*client.Client {
	t.Helper()
	tok := s.mint(t, "alice", "private")
	ctx := context.Background()
	tr, err := transport.NewStreamableHTTP("http://"+s.addr+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*client.Client{
		"http":    newMCPClient(tr),
		"connect": newMCPClient(transport.NewStdio(s.bin, append(os.Environ(), "CAPGATE_TOKEN="+tok), "connect", "http://"+s.addr+"/mcp")),
		"stdio": newMCPClient(transport.NewStdio(s.bin, append(os.Environ(), "CAPGATE_TOKEN="+tok, "CAPGATE_TOKEN_SECRET="+s.secret),
			"serve", "--stdio", "--config", s.config)),
	}
	for _, c := range out {
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestUpstreamAnnotationsNeverLoosened: an upstream's write tool
// (readOnly false, destructive true) and its unannotated tool, both
// classed LOW by the operator, are listed as writing and destructive; only
// the operator's explicit "no side effects" makes an unannotated tool
// read-only.
func TestUpstreamAnnotationsNeverLoosened(t *testing.T) {
	t.Parallel()
	s, _ := startHostile(t)
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		"hx__write": {false, true, false, true},
		"hx__bare":  {false, true, false, true},
		"hx__quiet": {true, false, true, false},
	}
	for name, c := range hostileClients(t, s) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			seen, listed := 0, []string{}
			for _, tl := range res.Tools {
				listed = append(listed, tl.Name)
				w, ok := want[tl.Name]
				if !ok {
					continue
				}
				seen++
				a := tl.Annotations
				if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil {
					t.Errorf("%s: a hint is missing: %+v", tl.Name, a)
					continue
				}
				got := hints{*a.ReadOnlyHint, *a.DestructiveHint, *a.IdempotentHint, *a.OpenWorldHint}
				if got != w {
					t.Errorf("%s: hints %+v, want %+v", tl.Name, got, w)
				}
			}
			if seen != len(want) {
				t.Fatalf("listed %d of %d tools: %v", seen, len(want), listed)
			}
		})
	}
}

// TestHostileOutputWithheld: whatever shape an upstream gives a credential
// (a key however spelled, nested past the walk's cap, a token in plain
// text, a resource, a prompt, an error message, a provider's error, a
// dying command's stderr), the caller never sees it and is told
// capability_invalid_output naming the key or format, not the value; a
// stderr tail is in capgate's log instead.
func TestHostileOutputWithheld(t *testing.T) {
	t.Parallel()
	s, logs := startHostile(t)
	secrets := []string{mcpSecret, bridgeSecret, extSecret}
	leaks := func(v any) bool {
		b, _ := json.Marshal(v)
		for _, sec := range secrets {
			if strings.Contains(string(b), sec) || strings.Contains(fmt.Sprint(v), sec) {
				return true
			}
		}
		return false
	}
	for name, c := range hostileClients(t, s) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			names := map[string]string{} // tool id → exposed name
			list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tl := range list.Tools {
				if tl.Meta != nil {
					id, _ := tl.Meta.AdditionalFields["capgate/tool_id"].(string)
					names[id] = tl.Name
				}
			}
			if name == "connect" { // the remote's names are what connect lists
				for _, tl := range list.Tools {
					names[tl.Name] = tl.Name
				}
			}
			exposed := func(id, fallback string) string {
				if n, ok := names[id]; ok {
					return n
				}
				return fallback
			}
			call := func(tool string, args map[string]any, wantCode string, wantIn ...string) {
				t.Helper()
				req := mcp.CallToolRequest{}
				req.Params.Name, req.Params.Arguments = tool, args
				res, err := c.CallTool(ctx, req)
				if err != nil {
					t.Errorf("%s %v: %v", tool, args, err)
					return
				}
				text := fmt.Sprint(res.Content)
				if !res.IsError || leaks(res) || !strings.Contains(text, wantCode) {
					t.Errorf("%s %v: the caller got %+v", tool, args, res)
				}
				for _, w := range wantIn {
					if !strings.Contains(text, w) {
						t.Errorf("%s %v: %q does not name %q", tool, args, text, w)
					}
				}
			}
			for _, key := range []string{"accessToken", "cookieJar", "clientSecret", "proxy-authorization", "X-Api-Key", "set-cookie", "private_key", "PASSWORD"} {
				call("hx__leak", map[string]any{"key": key}, "capability_invalid_output", "("+key+")")
			}
			call("hx__deep", map[string]any{"depth": 70}, "capability_invalid_output", "nested deeper than 64")
			call("hx__pem", nil, "capability_invalid_output", "PEM private key")
			call("hx__ghp", nil, "capability_invalid_output", "GitHub token")
			call("hx__fail", nil, "capability_invalid_output", "(client_secret)")
			gog := exposed("bridge:gog:gog.calendar.list_events", "gog__calendar_list_events")
			call(gog, map[string]any{"secret_error": true}, "capability_invalid_output", "(refresh_token)")
			call(gog, map[string]any{"secret_stderr": true}, "capability_backend_unavailable", "exit 3")
			call(exposed("ext:tools.leaky:crash", "tools_leaky__crash"), nil, "capability_backend_unavailable", "status 3")

			for _, uri := range []string{"hx://config", "hx://key"} {
				req := mcp.ReadResourceRequest{}
				req.Params.URI = uri
				res, err := c.ReadResource(ctx, req)
				if err == nil || leaks(res) || leaks(err.Error()) || !strings.Contains(err.Error(), "capability_invalid_output") {
					t.Errorf("read %s: %v %+v", uri, err, res)
				}
			}
			for _, p := range []string{"hx__leaky", "hx__broken"} {
				req := mcp.GetPromptRequest{}
				req.Params.Name = p
				res, err := c.GetPrompt(ctx, req)
				if err == nil || leaks(res) || leaks(err.Error()) || !strings.Contains(err.Error(), "capability_invalid_output") {
					t.Errorf("prompt %s: %v %+v", p, err, res)
				}
			}
		})
	}
	// The capability RPC answers the same.
	tok := s.mint(t, "bob", "private")
	for _, args := range [][]string{
		{"--capability", "mcp:hx:leak", "--input-json", `{"key":"clientSecret"}`},
		{"--capability", "gog.calendar", "--operation", "list_events", "--input-json", `{"secret_error":true}`},
	} {
		out, errb, code := s.as(t, tok, append([]string{"invoke"}, args...)...)
		if code != 1 || leaks(out+errb) || !strings.Contains(errb, "capability_invalid_output") || !strings.Contains(errb, "_token)") && !strings.Contains(errb, "(clientSecret)") {
			t.Errorf("rpc invoke %v: %d %s %s", args, code, out, errb)
		}
	}
	// The dying commands' stderr is the operator's to read.
	// The stderr tails are the operator's to read; what hardening refused
	// is in neither the log nor the audit trail nor the state.
	log := logs()
	if !strings.Contains(log, bridgeSecret) || !strings.Contains(log, extSecret) {
		t.Errorf("the stderr tails are not in capgate's log:\n%s", log)
	}
	if strings.Contains(log, mcpSecret) {
		t.Errorf("capgate's log holds a withheld secret:\n%s", log)
	}
	files := 0
	err := filepath.WalkDir(filepath.Join(s.dir, "data"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files++
		if err == nil && (strings.Contains(string(b), mcpSecret) || strings.Contains(string(b), bridgeSecret)) {
			t.Errorf("%s holds a withheld secret", path)
		}
		return err
	})
	if err != nil || files == 0 {
		t.Errorf("data dir: %d files, %v", files, err)
	}
}

// TestRelayedMessagesHardened: what an upstream sends the client while a
// call runs (a progress message, a log message, an elicitation request)
// passes the same check as the call's result. The hostile upstream, over
// streamable HTTP, puts a bearer token in each; the client sees none of
// them, the progress arrives without its text, the elicitation is refused
// to the upstream, and capgate's log names what it found.
func TestRelayedMessagesHardened(t *testing.T) {
	t.Parallel()
	addr := testkit.FreeAddr(t)
	testkit.ServeMCPFixture(t, "-http", addr, "-hostile")
	s := startServe(t, fmt.Sprintf(`
[policy.subjects.alice]
grants = ["rye.execute.tool.mcp.hx.*"]

[mcp.servers.hx]
url = "http://%s/mcp"
risk = "LOW"
`, addr))
	var mu sync.Mutex
	var seen []string
	note := func(what string, v any) {
		b, _ := json.Marshal(v)
		mu.Lock()
		seen = append(seen, what+" "+string(b))
		mu.Unlock()
	}
	c := s.mcpAs(t, s.mint(t, "alice", "private"), client.WithElicitationHandler(elicitFunc(func(_ context.Context, r mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
		note("elicitation", r.Params)
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept,
			Content: map[string]any{"ok": true}}}, nil
	})))
	c.OnNotification(func(n mcp.JSONRPCNotification) { note(n.Method, n.Params.AdditionalFields) })
	lv := mcp.SetLevelRequest{}
	lv.Params.Level = mcp.LoggingLevelDebug
	if err := c.SetLevel(context.Background(), lv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	req := mcp.CallToolRequest{}
	req.Params.Name = "hx__chatty"
	req.Params.Meta = &mcp.Meta{ProgressToken: "p1"}
	res, err := c.CallTool(ctx, req)
	if err != nil || res.IsError {
		t.Fatalf("chatty: %v %+v", err, res)
	}
	// Refused its elicitation, the upstream fails the call: its JSON-RPC
	// error reaches the client as it gave it (or a tool error would).
	req.Params.Name, req.Params.Meta = "hx__ask", nil
	var text string
	res, err = c.CallTool(ctx, req)
	if err != nil {
		text = err.Error()
	} else {
		b, _ := json.Marshal(res.Content)
		if text = string(b); !res.IsError && strings.Contains(text, "answered accept") {
			t.Errorf("ask: the elicitation reached the client: %s", text)
		}
	}
	// The notifications may still be on their way: wait for the last step.
	// The first may not come: mcp-go sends a call's progress on the call's
	// stream and the session's, and capgate drops a step overtaken on the
	// other stream (sources/mcp/progress.go); the last is never dropped.
	testkit.Poll(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range seen {
			if strings.HasPrefix(m, "notifications/progress") && strings.Contains(m, `"progress":2`) {
				return true
			}
		}
		return false
	})

	mu.Lock()
	defer mu.Unlock()
	var last []string
	for _, m := range seen {
		if strings.Contains(m, mcpSecret) {
			t.Errorf("the client saw %s", m)
		}
		switch {
		case !strings.HasPrefix(m, "notifications/progress"):
		case strings.Contains(m, `"progress":2`):
			last = append(last, m)
		case !strings.Contains(m, `"working"`):
			t.Errorf("the first progress step changed on the way: %s", m)
		}
	}
	// The last step arrives once, without its text (which holds a bearer token).
	if len(last) != 1 || strings.Contains(last[0], "message") {
		t.Errorf("last progress step = %v, want one, without its message (seen %v)", last, seen)
	}
	if strings.Contains(text, mcpSecret) {
		t.Errorf("ask's result holds the secret: %s", text)
	}
	// serve's stderr is read as it comes: wait for the lines rather than
	// read it once as the answers arrive.
	for _, want := range []string{"withheld an upstream progress message", "refused an upstream request of the client"} {
		if !testkit.Poll(5*time.Second, func() bool { return strings.Contains(s.logs(), want) }) {
			t.Errorf("capgate's log lacks %q:\n%s", want, s.logs())
		}
	}
	if logs := s.logs(); strings.Contains(logs, mcpSecret) {
		t.Error("capgate's log holds the secret")
	}
}

type elicitFunc func(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error)

func (f elicitFunc) Elicit(ctx context.Context, r mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	return f(ctx, r)
}
