package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

const capgatePkg = "github.com/capgate/capgate/cmd/capgate"

// served is a `capgate serve` subprocess on a temp config.
type served struct {
	bin, config, dir, addr, socket, secret string
	cmd                                    *exec.Cmd
	logs                                   func() string // what serve has logged so far (startServe)
	cg                                     *testkit.Served
}

func startServe(t *testing.T, extra string) *served {
	t.Helper()
	cg := testkit.StartCapgate(t, testkit.Capgate{Socket: true, Secret: "serve-test-secret-value-9f8e7d", Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.bridge.gog.*", "rye.execute.tool.mcp.fx.*"]

[capabilities.providers.gog]
command = [%q]

[mcp.servers.fx]
command = %q

[mcp.servers.fx.tools.t_00]
risk = "LOW"
[mcp.servers.fx.tools.t_02]
risk = "CRITICAL"
%s`, testkit.Build(t, testkit.BridgeFixture), testkit.Build(t, testkit.MCPFixture), extra)})
	s := fromCapgate(cg)
	if !strings.Contains(cg.Banner, "http://"+s.addr+"/rpc") || !strings.Contains(cg.Banner, "unix://"+s.socket) ||
		!strings.Contains(cg.Banner, "$CAPGATE_TOKEN_SECRET") || strings.Contains(cg.Banner, s.secret) {
		t.Errorf("banner:\n%s", cg.Banner)
	}
	return s
}

// fromCapgate is the served view of a testkit.StartCapgate server.
func fromCapgate(cg *testkit.Served) *served {
	return &served{bin: cg.Bin, config: cg.ConfigPath, dir: cg.Dir, addr: cg.Addr, socket: cg.Socket, secret: cg.Secret, cmd: cg.Cmd, logs: cg.Logs, cg: cg}
}

// run runs the capgate CLI with env added and returns stdout, stderr and
// the exit code.
func (s *served) run(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func (s *served) mint(t *testing.T, sub, chat string) string {
	t.Helper()
	return s.cg.Token(t, token.Claims{Sub: sub, ChatType: chat})
}

// as runs `capgate capability ...` with tok against the HTTP endpoint.
func (s *served) as(t *testing.T, tok string, args ...string) (string, string, int) {
	t.Helper()
	return s.run(t, []string{"ASH_CONTEXT_TOKEN=" + tok, "CAPGATE_URL=http://" + s.addr + "/rpc"}, append([]string{"capability"}, args...)...)
}

// TestServeCapabilityRPC drives a real `capgate serve` with the real CLI:
// two users, one bridge capability, flows, chat policy, spoofing, output
// hardening, approvals, the Unix socket and the audit file.
func TestServeCapabilityRPC(t *testing.T) {
	t.Parallel()
	s := startServe(t, "")
	alice, bob := s.mint(t, "alice", "private"), s.mint(t, "bob", "private")

	out, errb, code := s.as(t, alice, "list")
	if code != 0 || !strings.Contains(out, `"id": "gog.email"`) || !strings.Contains(out, `"name": "list_messages"`) {
		t.Fatalf("list: %d %s %s", code, out, errb)
	}
	// The Unix socket answers the same.
	sockOut, _, code := s.run(t, []string{"ASH_CONTEXT_TOKEN=" + alice}, "capability", "list", "--url", "unix://"+s.socket)
	if code != 0 || sockOut != out {
		t.Errorf("unix socket list: %d %s", code, sockOut)
	}

	out, errb, code = s.as(t, alice, "auth", "begin", "--capability", "gog.email", "--account", "work")
	flow := regexp.MustCompile(`caf_[0-9a-f]{32}`).FindString(out)
	if code != 0 || flow == "" || !strings.Contains(out, "auth_url") || strings.Contains(out, "nonce") {
		t.Fatalf("auth begin: %d %s %s", code, out, errb)
	}
	_, errb, code = s.as(t, bob, "auth", "complete", "--flow-id", flow, "--code", "authcode-Q7x")
	if code != 1 || !strings.Contains(errb, "capability_auth_flow_invalid") {
		t.Errorf("bob completes alice's flow: %d %s", code, errb)
	}
	out, errb, code = s.as(t, alice, "auth", "complete", "--flow-id", flow, "--callback-url", "https://localhost/cb?code=authcode-Q7x&state=s1")
	if code != 0 || !strings.Contains(out, `"account_ref": "work"`) {
		t.Fatalf("alice completes: %d %s %s", code, out, errb)
	}
	_, errb, code = s.as(t, alice, "auth", "complete", "--flow-id", flow, "--code", "authcode-Q7x")
	if code != 1 || !strings.Contains(errb, "capability_auth_flow_invalid") {
		t.Errorf("a flow completes once: %d %s", code, errb)
	}

	spoof := `{"folder":"inbox","user_id":"bob","chat_id":"x","chat_type":"private"}`
	out, errb, code = s.as(t, alice, "invoke", "--capability", "gog.email", "--operation", "list_messages", "--input-json", spoof)
	if code != 0 || !strings.Contains(out, `"token_sub": "alice"`) || !strings.Contains(out, `"ok": true`) || !strings.Contains(out, `"request_id": "cap_`) {
		t.Errorf("alice invokes: %d %s %s", code, out, errb)
	}
	_, errb, code = s.as(t, bob, "invoke", "--capability", "gog.email", "--operation", "list_messages", "--input-json", `{"user_id":"alice"}`)
	if code != 1 || !strings.Contains(errb, "capability_auth_required") || !strings.Contains(errb, "to allow it: run capability.auth.begin") {
		t.Errorf("bob has no credential: %d %s", code, errb)
	}
	group := s.mint(t, "alice", "group")
	_, errb, code = s.as(t, group, "invoke", "--capability", "gog.email", "--operation", "list_messages", "--input-json", spoof)
	if code != 1 || !strings.Contains(errb, "capability_access_denied") {
		t.Errorf("sensitive in a group: %d %s", code, errb)
	}
	out, errb, code = s.as(t, group, "invoke", "--capability", "gog.calendar", "--operation", "list_events", "--input-json", `{"leak":true}`)
	if code != 1 || !strings.Contains(errb, "capability_invalid_output") || strings.Contains(out+errb, "ya29") {
		t.Errorf("leaky provider: %d %s %s", code, out, errb)
	}

	// Approvals: the operator approves on the host, the retry passes once.
	_, errb, code = s.as(t, alice, "invoke", "--capability", "mcp:fx:t_02", "--input-json", `{"n":1}`)
	id := regexp.MustCompile(`apr_[0-9a-f]{32}`).FindString(errb)
	if code != 1 || !strings.Contains(errb, "approval_required") || id == "" {
		t.Fatalf("critical tool: %d %s", code, errb)
	}
	if out, errb, code := s.run(t, nil, "approve", id, "--config", s.config); code != 0 {
		t.Fatalf("approve: %d %s %s", code, out, errb)
	}
	if out, errb, code := s.as(t, alice, "invoke", "--capability", "mcp:fx:t_02", "--input-json", `{"n":1}`); code != 0 {
		t.Errorf("approved retry: %d %s %s", code, out, errb)
	}

	// The protocol's own error codes.
	for _, tc := range []struct {
		body     string
		code     int
		contains string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"capability.nope","params":{}}`, -32601, "method not found"},
		{`{"jsonrpc":"2.0","id":1,"method":"capability.list","params":{}}`, -32602, "token_invalid: missing"},
		{`{"jsonrpc":"2.0","id":1,"method":"capability.list","params":{"context_token":"x.y.z"}}`, -32602, "token_invalid: format"},
		{`{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":"` + alice + `","capability":"gog.nope","operation":"x"}}`, -32603, "capability_not_found: "},
		{`{"jsonrpc":"2.0","id":1,"method":"capability.list"`, -32700, "parse error"},
	} {
		resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Error struct {
				Code    int
				Message string
				Data    struct{ Code string }
			}
		}
		json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.contains) {
			t.Errorf("%s: %+v", tc.body, r.Error)
		}
		if tc.code == -32603 && r.Error.Data.Code != "capability_not_found" {
			t.Errorf("data.code: %+v", r.Error)
		}
	}

	// Graceful stop; then the audit file holds no token or secret.
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve exit: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	if _, err := os.Stat(s.socket); !os.IsNotExist(err) {
		t.Errorf("the socket is left behind: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(s.dir, "data", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{alice, bob, group, strings.Split(alice, ".")[2], s.secret, "ya29", "authcode-Q7x"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("the audit file holds %.24s…", secret)
		}
	}
	if n := strings.Count(string(b), "\n"); n < 15 {
		t.Errorf("audit file has %d lines", n)
	}
}

// TestConnectAndStdio reaches a running capgate the sandbox way: `capgate
// connect` as a stdio MCP server, driven by an mcp-go client, forwarding
// to the host over HTTP; and `capgate serve --stdio` directly. Both serve
// the tools, and the resources, templates and prompts of an upstream (the
// conformance fixture), with completions.
func TestConnectAndStdio(t *testing.T) {
	t.Parallel()
	s := startServe(t, fmt.Sprintf("[mcp.servers.cf]\ncommand = %q\n", testkit.Build(t, testkit.ConformanceFixture)))
	tok := s.mint(t, "sandbox", "private")
	for name, argv := range map[string][]string{
		"connect": {"connect", "http://" + s.addr + "/mcp"},
		"stdio":   {"serve", "--stdio", "--config", s.config},
	} {
		t.Run(name, func(t *testing.T) {
			env := append(os.Environ(), "CAPGATE_TOKEN="+tok, "CAPGATE_TOKEN_SECRET="+s.secret)
			tr := transport.NewStdio(s.bin, env, argv...)
			c := newMCPClient(tr)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			init := mcp.InitializeRequest{}
			init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
			if _, err := c.Initialize(ctx, init); err != nil {
				t.Fatal(err)
			}
			tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil || len(tools.Tools) < 3 {
				t.Fatalf("tools: %v %v", err, tools)
			}
			req := mcp.CallToolRequest{}
			req.Params.Name, req.Params.Arguments = "fx__t_00", map[string]any{}
			res, err := c.CallTool(ctx, req)
			if err != nil || res.IsError {
				t.Fatalf("t_00: %v %+v", err, res)
			}
			req.Params.Name = "fx__t_02"
			res, err = c.CallTool(ctx, req)
			if err != nil || !res.IsError || !strings.Contains(fmt.Sprint(res.Content), "approval_required") {
				t.Errorf("critical tool: %v %+v", err, res)
			}
			checkRelayed(ctx, t, c)
		})
	}
	// A bad token fails at once, with a message.
	_, errb, code := s.run(t, []string{"CAPGATE_TOKEN=bad"}, "connect", "http://"+s.addr+"/mcp")
	if code != 1 || !strings.Contains(errb, "connecting to") {
		t.Errorf("bad token: %d %s", code, errb)
	}
}

// TestBench runs `capgate bench` against a real capgate in front of the
// MCP fixture served over streamable HTTP.
func TestBench(t *testing.T) {
	t.Parallel()
	upstream := testkit.FreeAddr(t)
	kill := testkit.ServeMCPFixture(t, "-http", upstream)
	defer kill()
	s := startServe(t, fmt.Sprintf("[policy.subjects.bench]\ngrants = [\"rye.execute.tool.mcp.up.*\"]\n[mcp.servers.up]\nurl = \"http://%s/mcp\"\n[mcp.servers.up.tools.t_00]\nrisk = \"LOW\"\n", upstream))
	// The catalog lists the HTTP upstream once it answers.
	tok := s.mint(t, "bench", "private")
	out, errb, code := s.run(t, []string{"CAPGATE_TOKEN=" + tok}, "bench",
		"--direct", "http://"+upstream+"/mcp", "--direct-tool", "t_00",
		"--through", "http://"+s.addr+"/mcp", "--through-tool", "up__t_00",
		"--calls", "40", "--concurrency", "1,4", "--pid", fmt.Sprint(s.cmd.Process.Pid))
	if code != 0 {
		t.Fatalf("bench: %d %s %s", code, out, errb)
	}
	rows := regexp.MustCompile(`(?m)^(1|4)\s+capgate\s+40\s+0\s+\d+µs\s+\d+µs\s+\d+\s+\d+µs$`).FindAllString(out, -1)
	if len(rows) != 2 || !regexp.MustCompile(`(?m)^4\s+direct\s+40\s+0\s`).MatchString(out) {
		t.Errorf("bench output:\n%s", out)
	}
	// Pinned to the session protocol, and to one it does not speak.
	out, errb, code = s.run(t, []string{"CAPGATE_TOKEN=" + tok}, "bench", "--protocol", "2025-11-25",
		"--direct", "http://"+upstream+"/mcp", "--direct-tool", "t_00",
		"--through", "http://"+s.addr+"/mcp", "--through-tool", "up__t_00", "--calls", "40", "--concurrency", "4")
	if code != 0 || !regexp.MustCompile(`(?m)^4\s+capgate\s+40\s+0\s`).MatchString(out) {
		t.Errorf("bench --protocol 2025-11-25: %d\n%s%s", code, out, errb)
	}
	if _, errb, code = s.run(t, nil, "bench", "--protocol", "2024-01-01", "--direct", "http://"+upstream+"/mcp",
		"--direct-tool", "t_00", "--through", "http://"+s.addr+"/mcp", "--through-tool", "up__t_00"); code == 0 ||
		!strings.Contains(errb, `protocol "2024-01-01"`) {
		t.Errorf("bench --protocol 2024-01-01: %d %s", code, errb)
	}
	// --json: a level per concurrency, and an error as JSON.
	out, errb, code = s.run(t, []string{"CAPGATE_TOKEN=" + tok}, "bench", "--json",
		"--direct", "http://"+upstream+"/mcp", "--direct-tool", "t_00",
		"--through", "http://"+s.addr+"/mcp", "--through-tool", "up__t_00",
		"--calls", "20", "--concurrency", "1,2", "--pid", fmt.Sprint(s.cmd.Process.Pid))
	type stats struct {
		Calls  *int     `json:"calls"`
		Errors *int     `json:"errors"`
		P50    *float64 `json:"p50_us"`
		P99    *float64 `json:"p99_us"`
		Rate   *float64 `json:"calls_per_second"`
	}
	var levels []struct {
		Concurrency int      `json:"concurrency"`
		Direct      stats    `json:"direct"`
		Capgate     stats    `json:"capgate"`
		CPU         *float64 `json:"capgate_cpu_per_call_us"`
	}
	if err := json.Unmarshal([]byte(out), &levels); code != 0 || err != nil || len(levels) != 2 {
		t.Fatalf("bench --json: %d %v\n%s%s", code, err, out, errb)
	}
	for i, l := range levels {
		for _, p := range []stats{l.Direct, l.Capgate} {
			if l.Concurrency != i+1 || p.Calls == nil || *p.Calls != 20 || p.Errors == nil || *p.Errors != 0 ||
				p.P50 == nil || *p.P50 <= 0 || p.P99 == nil || *p.P99 < *p.P50 || p.Rate == nil || *p.Rate <= 0 || l.CPU == nil || *l.CPU <= 0 {
				t.Errorf("bench --json level %d: %s", i, out)
			}
		}
	}
	if _, errb, code = s.run(t, nil, "bench", "--json"); code != 2 || !strings.Contains(errb, `{"error":{"code":"usage"`) {
		t.Errorf("bench --json without its flags: %d %s", code, errb)
	}
}

// checkRelayed checks that c is served the conformance fixture's resources,
// template and prompts (as upstream "cf") and that reads, gets and
// completions reach it.
func checkRelayed(ctx context.Context, t *testing.T, c *client.Client) {
	t.Helper()
	prompts, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
	if err != nil || !slices.ContainsFunc(prompts.Prompts, func(p mcp.Prompt) bool { return p.Name == "cf__test_prompt_with_arguments" }) {
		t.Fatalf("prompts: %v %+v", err, prompts)
	}
	get := mcp.GetPromptRequest{}
	get.Params.Name, get.Params.Arguments = "cf__test_prompt_with_arguments", map[string]string{"arg1": "one", "arg2": "two"}
	p, err := c.GetPrompt(ctx, get)
	if err != nil || len(p.Messages) != 1 || !strings.Contains(fmt.Sprint(p.Messages[0].Content), "arg1='one', arg2='two'") {
		t.Errorf("prompt: %v %+v", err, p)
	}
	resources, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
	if err != nil || !slices.ContainsFunc(resources.Resources, func(r mcp.Resource) bool { return r.URI == "test://static-text" }) {
		t.Fatalf("resources: %v %+v", err, resources)
	}
	read := func(uri, want string) {
		t.Helper()
		req := mcp.ReadResourceRequest{}
		req.Params.URI = uri
		res, err := c.ReadResource(ctx, req)
		if err != nil || len(res.Contents) != 1 || !strings.Contains(fmt.Sprint(res.Contents[0]), want) {
			t.Errorf("read %s: %v %+v", uri, err, res)
		}
	}
	read("test://static-text", "This is the content of the static text resource.")
	read("test://template/42/data", "Data for ID: 42")
	templates, err := c.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
	if err != nil || len(templates.ResourceTemplates) != 1 || templates.ResourceTemplates[0].URITemplate.Raw() != "test://template/{id}/data" {
		t.Errorf("templates: %v %+v", err, templates)
	}
	comp := mcp.CompleteRequest{}
	comp.Params.Ref = mcp.PromptReference{Type: "ref/prompt", Name: "cf__test_prompt_with_arguments"}
	comp.Params.Argument.Name, comp.Params.Argument.Value = "arg1", ""
	cr, err := c.Complete(ctx, comp)
	if err != nil || len(cr.Completion.Values) == 0 {
		t.Errorf("completion: %v %+v", err, cr)
	}
}
