package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

const corpusFixture = "github.com/capgate/capgate/internal/testkit/corpusfixture"

// corpusServers is config for upstream MCP servers, each listing one file
// of toolsearch's corpus of real tools.
func corpusServers(t *testing.T, names ...string) string {
	t.Helper()
	bin := testkit.Build(t, corpusFixture)
	var b strings.Builder
	for _, n := range names {
		f, err := filepath.Abs(filepath.Join("..", "..", "toolsearch", "testdata", "corpus", n+".json"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "[mcp.servers.%s]\ncommand = %q\nargs = [\"-corpus\", %q]\nrisk = \"LOW\"\n\n", n, bin, f)
	}
	return b.String()
}

// mcpClients connects to s as tok over streamable HTTP and over `capgate
// serve --stdio` (a second serve on the same config), each at both protocol
// versions, initialized and checked to speak the version asked for.
func mcpClients(t *testing.T, s *served, tok string) map[string]*client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := map[string]*client.Client{}
	for _, version := range []string{mcp.ProtocolVersion20260728, mcp.ProtocolVersion20251125} {
		tr, err := transport.NewStreamableHTTP("http://"+s.addr+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
		if err != nil {
			t.Fatal(err)
		}
		out["http-"+version] = newMCPClient(tr)
		out["stdio-"+version] = newMCPClient(transport.NewStdio(s.bin, append(os.Environ(), "CAPGATE_TOKEN="+tok, "CAPGATE_TOKEN_SECRET="+s.secret), "serve", "--stdio", "--config", s.config))
	}
	for name, c := range out {
		// The stdio client's process lives as long as Start's context.
		if err := c.Start(context.Background()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(func() { c.Close() })
		init := mcp.InitializeRequest{}
		_, init.Params.ProtocolVersion, _ = strings.Cut(name, "-")
		if _, err := c.Initialize(ctx, init); err != nil {
			if r, ok := client.GetStderr(c); ok {
				b, _ := io.ReadAll(io.LimitReader(r, 4096))
				t.Fatalf("%s: %v: %s", name, err, b)
			}
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.ProtocolVersion(); got != init.Params.ProtocolVersion {
			t.Fatalf("%s: the client speaks %s", name, got)
		}
	}
	return out
}

func callText(ctx context.Context, t *testing.T, c *client.Client, name string, args map[string]any) (*mcp.CallToolResult, string) {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	return res, strings.Join(text, "\n")
}

// searchNames asks search_tools and returns the names it found.
func searchNames(ctx context.Context, t *testing.T, c *client.Client, query string) []string {
	t.Helper()
	res, text := callText(ctx, t, c, "search_tools", map[string]any{"query": query, "limit": 20})
	if res.IsError {
		t.Fatalf("search_tools %q: %s", query, text)
	}
	var ans struct {
		Tools []struct {
			Name, Risk  string
			InputSchema json.RawMessage `json:"input_schema"`
		}
	}
	if err := json.Unmarshal([]byte(text), &ans); err != nil {
		t.Fatalf("search_tools %q: %v: %s", query, err, text)
	}
	var names []string
	for _, h := range ans.Tools {
		if h.Risk == "" || len(h.InputSchema) == 0 {
			t.Errorf("search_tools %q: a hit without risk or schema: %s", query, text)
		}
		names = append(names, h.Name)
	}
	return names
}

func listNames(ctx context.Context, t *testing.T, c *client.Client) ([]string, []mcp.Tool) {
	t.Helper()
	res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		if r, ok := client.GetStderr(c); ok {
			b, _ := io.ReadAll(io.LimitReader(r, 8192))
			t.Fatalf("%v: %s", err, b)
		}
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names, res.Tools
}

// TestToolSearch drives tool search through a real capgate serve in auto
// mode over real upstreams that list real servers' tools, over both MCP
// transports at both protocol versions and the capability RPC: a caller with many tools gets the
// pinned tool, search_tools and call_tool; one with few gets its list;
// search finds only what the caller could call (grants, the acknowledge
// tier, hidden tools), call_tool runs a tool through every gate and the
// audit records it as that tool, via call_tool.
func TestToolSearch(t *testing.T) {
	t.Parallel()
	cfg := `
[discovery]
mode = "auto"
threshold = 40
pinned = ["mcp:memory:read_graph"]

[policy.subjects.wide]
grants = ["rye.execute.tool.mcp.github.*", "rye.execute.tool.mcp.filesystem.*", "rye.execute.tool.mcp.slack.*",
  "rye.execute.tool.mcp.playwright.*", "rye.execute.tool.mcp.memory.*"]
acknowledge = ["elevated"]

[policy.subjects.narrow]
grants = ["rye.execute.tool.mcp.slack.*", "rye.execute.tool.mcp.memory.read_graph"]

[mcp.servers.github.tools.create_issue]
risk = "HIGH"
[mcp.servers.github.tools.merge_pull_request]
risk = "CRITICAL"
[mcp.servers.github.tools.fork_repository]
hidden = true
` + corpusServers(t, "github", "filesystem", "slack", "playwright", "memory")
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Secret: "search-test-secret-value-5c4b3a", Config: cfg}))
	// The token's ack narrows the policy's: "none" acknowledges no tier.
	wide := s.cg.Token(t, token.Claims{Sub: "wide", ChatType: "private", Ack: []string{"none"}})
	acked := s.cg.Token(t, token.Claims{Sub: "wide", ChatType: "private"})
	narrow := s.cg.Token(t, token.Claims{Sub: "narrow", ChatType: "private"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for proto, c := range mcpClients(t, s, wide) {
		t.Run(proto, func(t *testing.T) {
			names, tools := listNames(ctx, t, c)
			if !slices.Equal(names, []string{"call_tool", "memory__read_graph", "search_tools"}) {
				t.Fatalf("search mode tools/list: %v", names)
			}
			for _, tl := range tools {
				// 82 listed less the hidden one, and the HIGH one needs an acknowledgement.
				if tl.Name == "search_tools" && (!strings.Contains(tl.Description, "Search the 80 tools") ||
					!strings.Contains(tl.Description, "github (24)") || !strings.Contains(tl.Description, "slack (8)")) {
					t.Errorf("search_tools description: %s", tl.Description)
				}
			}
			if got := searchNames(ctx, t, c, "open a pull request from my branch"); !slices.Contains(got[:min(5, len(got))], "github__create_pull_request") {
				t.Errorf("pull request: %v", got)
			}
			// Not acknowledged, not found; hidden, never found.
			if got := searchNames(ctx, t, c, "create an issue"); slices.Contains(got, "github__create_issue") {
				t.Errorf("an unacknowledged HIGH tool was found: %v", got)
			}
			if got := searchNames(ctx, t, c, "fork a repository"); slices.Contains(got, "github__fork_repository") {
				t.Errorf("a hidden tool was found: %v", got)
			}
			// call_tool runs it through the router: a result from the upstream.
			res, text := callText(ctx, t, c, "call_tool", map[string]any{"name": "slack__slack_post_message",
				"arguments": map[string]any{"channel_id": "C1", "text": "from " + proto}})
			if res.IsError || !strings.Contains(text, `ran slack_post_message {"channel_id":"C1","text":"from `+proto+`"}`) {
				t.Errorf("call_tool: %s", text)
			}
			// Every gate: the CRITICAL tool waits for an approval, a bad
			// input is refused by the schema, a tool it cannot see is not found.
			if res, text := callText(ctx, t, c, "call_tool", map[string]any{"name": "github__merge_pull_request",
				"arguments": map[string]any{"owner": "o", "repo": "r", "pull_number": 1}}); !res.IsError || !strings.Contains(text, "approval_required") {
				t.Errorf("call_tool of a CRITICAL tool: %s", text)
			}
			if res, text := callText(ctx, t, c, "call_tool", map[string]any{"name": "slack__slack_post_message",
				"arguments": map[string]any{"channel_id": 7}}); !res.IsError || !strings.Contains(text, "capability_invalid_input") {
				t.Errorf("call_tool with a bad input: %s", text)
			}
			if res, text := callText(ctx, t, c, "call_tool", map[string]any{"name": "github__fork_repository"}); !res.IsError || !strings.Contains(text, "capability_not_found") {
				t.Errorf("call_tool of a hidden tool: %s", text)
			}
			if res, text := callText(ctx, t, c, "search_tools", map[string]any{"query": "x", "limit": 21}); !res.IsError || !strings.Contains(text, "input.limit") {
				t.Errorf("search_tools limit 21: %s", text)
			}
		})
	}
	for proto, c := range mcpClients(t, s, acked) {
		if got := searchNames(ctx, t, c, "create an issue"); !slices.Contains(got[:min(5, len(got))], "github__create_issue") {
			t.Errorf("%s: acknowledged, create an issue: %v", proto, got)
		}
	}
	// Few tools: auto mode lists them all.
	for proto, c := range mcpClients(t, s, narrow) {
		names, _ := listNames(ctx, t, c)
		if len(names) != 9 || slices.Contains(names, "search_tools") {
			t.Errorf("%s: narrow caller's list: %v", proto, names)
		}
	}

	// The capability RPC: the same search, tools named by id too.
	rpc := func(tok, params string) (out struct {
		Result struct{ Tools []struct{ ID, Name string } }
		Error  *struct{ Message string }
	}) {
		body := `{"jsonrpc":"2.0","id":1,"method":"capability.search","params":{"context_token":"` + tok + `",` + params + `}}`
		resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if r := rpc(narrow, `"query":"post a message to slack","limit":3`); r.Error != nil || len(r.Result.Tools) != 3 ||
		r.Result.Tools[0].ID != "mcp:slack:slack_post_message" {
		t.Errorf("capability.search: %+v", r)
	}
	if r := rpc(narrow, `"query":"open a pull request"`); r.Error != nil || slices.ContainsFunc(r.Result.Tools, func(h struct{ ID, Name string }) bool {
		return strings.HasPrefix(h.ID, "mcp:github:")
	}) {
		t.Errorf("capability.search found what narrow cannot call: %+v", r)
	}
	if r := rpc(narrow, `"limit":3`); r.Error == nil || !strings.Contains(r.Error.Message, "query") {
		t.Errorf("capability.search without a query: %+v", r)
	}

	// The audit: call_tool's calls are records of the tool, via call_tool.
	if err := s.cg.Stop(t); err != nil {
		t.Errorf("serve exit: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(s.dir, "data", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var via int
	for line := range strings.Lines(string(b)) {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		if ev["type"] == "tool_call" && ev["tool_name"] == "slack__slack_post_message" && ev["decision"] == "allow" {
			if ev["via"] != "call_tool" || ev["tool"] != "mcp:slack:slack_post_message" {
				t.Errorf("call_tool's record: %s", line)
			}
			via++
		}
	}
	if via != 4 {
		t.Errorf("%d allowed call_tool records of slack__slack_post_message; want 4 (http, stdio; both protocols)", via)
	}
}

// TestToolSearchSavings measures what search mode saves a client with
// the whole corpus behind one capgate (300 tools of 22 servers): the
// bytes of tools/list in list mode, against search mode's tools/list plus
// an average search_tools answer (the corpus's queries, default limit),
// through a real capgate serve over HTTP. Target: at least 85% less.
func TestToolSearchSavings(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "..", "toolsearch", "testdata", "corpus", "*.json"))
	if err != nil || len(files) < 10 {
		t.Fatalf("corpus: %v %d", err, len(files))
	}
	var names, grants []string
	for _, f := range files {
		n := strings.TrimSuffix(filepath.Base(f), ".json")
		names = append(names, n)
		grants = append(grants, fmt.Sprintf("%q", "rye.execute.tool.mcp."+n+".*"))
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "toolsearch", "testdata", "queries.json"))
	if err != nil {
		t.Fatal(err)
	}
	var queries []struct{ Query string }
	if err := json.Unmarshal(b, &queries); err != nil {
		t.Fatal(err)
	}
	servers := corpusServers(t, names...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	size := func(v any) int {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	// One serve measures both modes: list, then search after a reload
	// (the 22 upstreams are kept, not started again).
	cfg := fmt.Sprintf("[discovery]\nmode = \"list\"\n\n[policy.subjects.all]\ngrants = [%s]\n\n%s", strings.Join(grants, ", "), servers)
	cg := testkit.StartCapgate(t, testkit.Capgate{Secret: "search-savings-secret-7a6b5c", Config: cfg})
	tok := cg.Token(t, token.Claims{Sub: "all", ChatType: "private"})
	measure := func(mode string) (list, tools int, answers []int) {
		tr, err := transport.NewStreamableHTTP(cg.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + tok}))
		if err != nil {
			t.Fatal(err)
		}
		c := newMCPClient(tr)
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
		res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if mode == "search" {
			for _, q := range queries {
				r, text := callText(ctx, t, c, "search_tools", map[string]any{"query": q.Query})
				if r.IsError {
					t.Fatalf("search_tools %q: %s", q.Query, text)
				}
				answers = append(answers, size(r))
			}
		}
		return size(res), len(res.Tools), answers
	}
	listBytes, listed, _ := measure("list")
	listConfig, err := os.ReadFile(cg.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, cg.ConfigPath, strings.Replace(string(listConfig), `mode = "list"`, `mode = "search"`, 1))
	if err := cg.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Minute, "serve to apply the reload", func() bool { return strings.Contains(cg.Logs(), "reload applied") })
	searchBytes, searchListed, answers := measure("search")
	if listed < 300 || searchListed != 2 {
		t.Fatalf("list mode listed %d tools, search mode %d", listed, searchListed)
	}
	sum := 0
	for _, a := range answers {
		sum += a
	}
	avg := sum / len(answers)
	saved := 1 - float64(searchBytes+avg)/float64(listBytes)
	t.Logf("tools/list, list mode: %d tools, %d bytes; search mode: %d bytes + an average search_tools answer of %d bytes (%d queries) = %d bytes: %.1f%% less",
		listed, listBytes, searchBytes, avg, len(answers), searchBytes+avg, 100*saved)
	if saved < 0.85 {
		t.Errorf("search mode saves %.1f%%; the target is 85%%", 100*saved)
	}
}
