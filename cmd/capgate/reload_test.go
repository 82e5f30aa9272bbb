package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// reloadConfig is the config the reload tests start from: upstream fx,
// whose tools every caller may call.
const reloadConfig = `
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]

[mcp.servers.fx]
command = %q
risk = "LOW"
`

// reloaded is reloadConfig after the edit the tests make: fx may no longer
// be called, and a new upstream fy may.
const reloaded = `
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fy.*"]

[mcp.servers.fx]
command = %q
risk = "LOW"

[mcp.servers.fy]
command = %[1]q
risk = "LOW"

[mcp.servers.fy.tools.echo]
description = "Echo, as reloaded"
`

type reloadServe struct {
	*testkit.Served
	fixture string
	head    string // the [server] table StartCapgate wrote (and what the test put in it)
	tok     string
}

// startReload starts serve on reloadConfig, with extra in its [server] table.
func startReload(t *testing.T, extra string) *reloadServe {
	t.Helper()
	fixture := testkit.Build(t, testkit.MCPFixture)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: extra + fmt.Sprintf(reloadConfig, fixture)})
	src, err := os.ReadFile(cg.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(string(src), "\n[policy]")
	return &reloadServe{Served: cg, fixture: fixture, head: head, tok: cg.Token(t, token.Claims{Sub: "alice", ChatType: "private"})}
}

// write replaces the config after its [server] table.
func (s *reloadServe) write(t *testing.T, body string) {
	t.Helper()
	if err := os.WriteFile(s.ConfigPath, []byte(s.head+body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits until serve's log holds want n times.
func (s *reloadServe) waitLog(t *testing.T, want string, n int) {
	t.Helper()
	if !testkit.Poll(60*time.Second, func() bool { return strings.Count(s.Logs(), want) >= n }) {
		t.Fatalf("serve never logged %q %d times; its log:\n%s", want, n, s.Logs())
	}
}

func (s *reloadServe) hup(t *testing.T) {
	t.Helper()
	if err := s.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// modernMeta is a stateless (2026-07-28) request's _meta.
const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

// call calls a tool statelessly (2026-07-28) and returns the body.
func (s *reloadServe) call(t *testing.T, name, args string) string {
	t.Helper()
	status, _, b := testkit.PostMCP(t, s.URL, s.tok, name,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+name+`","arguments":`+args+`,`+modernMeta+`}}`)
	if status != 200 {
		t.Fatalf("tools/call %s: %d %s", name, status, b)
	}
	return string(b)
}

// TestServeReloadOnSIGHUP: a grant is dropped, an upstream with an
// override added in the config and a skill beside it; after SIGHUP the new
// tool is listed as overridden and callable, the skill is a prompt, the
// dropped grant no longer allows a call, and a 2025-11-25 session opened
// before the reload goes on working.
func TestServeReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	sid := testkit.OpenSession(t, s.URL, s.tok, "{}")
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if _, _, b := testkit.PostSession(t, s.URL, s.tok, sid, list); !strings.Contains(string(b), `"fx__echo"`) || strings.Contains(string(b), "fy__") {
		t.Fatalf("tools/list before the reload: %.600s", b)
	}
	if out := s.call(t, "fx__echo", `{"message":"before"}`); !strings.Contains(out, "echo: before") {
		t.Fatalf("fx__echo before the reload: %.400s", out)
	}

	prompts := `{"jsonrpc":"2.0","id":4,"method":"prompts/list"}`
	if _, _, b := testkit.PostSession(t, s.URL, s.tok, sid, prompts); strings.Contains(string(b), "tally") {
		t.Fatalf("prompts/list before the skill was written: %.600s", b)
	}
	skill := filepath.Join(s.Dir, "skills", "tally", "SKILL.md")
	if err := os.MkdirAll(filepath.Dir(skill), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(skill, []byte("---\ndescription: Tally things\n---\n\nTally them.\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	s.write(t, fmt.Sprintf(reloaded, s.fixture))
	s.hup(t)
	s.waitLog(t, "reload applied", 1)

	_, _, b := testkit.PostSession(t, s.URL, s.tok, sid, list)
	if !strings.Contains(string(b), `"fy__echo"`) || !strings.Contains(string(b), "Echo, as reloaded") {
		t.Errorf("tools/list in the session opened before the reload: %.600s; want fy__echo with its overridden description", b)
	}
	if _, _, b := testkit.PostSession(t, s.URL, s.tok, sid, prompts); !strings.Contains(string(b), `"tally"`) {
		t.Errorf("prompts/list after the reload: %.600s; want the skill tally", b)
	}
	_, _, b = testkit.PostSession(t, s.URL, s.tok, sid,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fy__echo","arguments":{"message":"in session"}}}`)
	if !strings.Contains(string(b), "echo: in session") {
		t.Errorf("fy__echo in the session opened before the reload: %.600s", b)
	}
	if out := s.call(t, "fy__echo", `{"message":"after"}`); !strings.Contains(out, "echo: after") {
		t.Errorf("fy__echo after the reload: %.400s", out)
	}
	if out := s.call(t, "fx__echo", `{"message":"after"}`); !strings.Contains(out, "permission_denied") || !strings.Contains(out, "rye.execute.tool.mcp.fx.echo") {
		t.Errorf("fx__echo after its grant was dropped: %.400s; want permission_denied", out)
	}
}

// TestServeReloadKeepsCallsInFlight: a slow call that began before a
// reload which removes its upstream finishes with its result; the
// upstream's tools are gone after.
func TestServeReloadKeepsCallsInFlight(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	// The call streams its progress: the first step says it is running
	// upstream (it takes 3 s).
	req, err := http.NewRequest("POST", s.URL+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__slow","arguments":{"delay_ms":1000},`+
			`"_meta":{"progressToken":"p1","io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Authorization": "Bearer " + s.tok, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "fx__slow"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	var head strings.Builder
	for !strings.Contains(head.String(), "notifications/progress") {
		line, err := body.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			t.Fatalf("the slow call's stream ended before its first progress: %v\n%s", err, head.String())
		}
	}
	done := make(chan string, 1)
	go func() {
		rest, _ := io.ReadAll(body)
		done <- head.String() + string(rest)
	}()
	s.write(t, `
[policy]
grants = ["rye.fetch.*"]
`)
	s.hup(t)
	s.waitLog(t, "reload applied", 1)
	select {
	case out := <-done:
		t.Fatalf("the slow call ended before the reload was applied: %.400s", out)
	default:
	}
	if out := <-done; !strings.Contains(out, `"done"`) || strings.Contains(out, `"isError":true`) {
		t.Errorf("the call in flight during the reload: %.600s; want its result", out)
	}
	status, _, b := testkit.PostMCP(t, s.URL, s.tok, "fx__echo",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fx__echo","arguments":{"message":"gone"},`+modernMeta+`}}`)
	if status != 400 || !strings.Contains(string(b), "tool 'fx__echo' not found") {
		t.Errorf("fx__echo after fx was removed: %d %.400s; want not found", status, b)
	}
}

// TestServeReloadRefusesABrokenConfig: a config with a bad value is
// refused with its file:line in the log, and the running config keeps
// serving; `capgate reload` refuses it too, naming the line, and sends
// nothing.
func TestServeReloadRefusesABrokenConfig(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	// Line 3 of the body is the grants line.
	s.write(t, `
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.*"]
rate_limit = { per_minute = -1 }

[mcp.servers.fx]
command = "`+s.fixture+`"
risk = "LOW"
`)
	line := strings.Count(s.head, "\n") + 4 // the rate_limit line
	s.hup(t)
	s.waitLog(t, "reload refused", 1)
	want := s.ConfigPath + ":" + strconv.Itoa(line) + ": policy.rate_limit"
	if !strings.Contains(s.Logs(), want) {
		t.Errorf("serve's log does not name %q:\n%s", want, s.Logs())
	}
	if out := s.call(t, "fx__echo", `{"message":"still"}`); !strings.Contains(out, "echo: still") {
		t.Errorf("fx__echo after a refused reload: %.400s; want the running config to serve", out)
	}

	out, errb, code := fromCapgate(s.Served).run(t, nil, "reload", "--config", s.ConfigPath)
	if code != 2 || !strings.Contains(errb, want) || strings.Contains(out, "SIGHUP") {
		t.Errorf("capgate reload of a broken config: %d %q %q; want exit 2 naming %s", code, out, errb, want)
	}
}

// TestCapgateReload: `capgate reload` finds the serve of the config's
// data dir and makes it reload.
func TestCapgateReload(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	s.write(t, fmt.Sprintf(reloaded, s.fixture))
	out, errb, code := fromCapgate(s.Served).run(t, nil, "reload", "--config", s.ConfigPath)
	if code != 0 || !strings.Contains(out, "sent SIGHUP to capgate serve (pid "+strconv.Itoa(s.Cmd.Process.Pid)+")") {
		t.Fatalf("capgate reload: %d %q %q", code, out, errb)
	}
	s.waitLog(t, "reload applied", 1)
	if out := s.call(t, "fy__echo", `{"message":"reloaded"}`); !strings.Contains(out, "echo: reloaded") {
		t.Errorf("fy__echo after capgate reload: %.400s", out)
	}
	s.Stop(t)
	if _, errb, code := fromCapgate(s.Served).run(t, nil, "reload", "--config", s.ConfigPath); code != 1 || !strings.Contains(errb, "no capgate serve is running") {
		t.Errorf("capgate reload with no serve: %d %q; want exit 1", code, errb)
	}
}

// TestServeWatchConfig: with [server] watch_config, a write of the config
// is reloaded without a signal.
func TestServeWatchConfig(t *testing.T) {
	t.Parallel()
	s := startReload(t, "watch_config = true\n")
	s.write(t, fmt.Sprintf(reloaded, s.fixture))
	s.waitLog(t, "reload applied", 1)
	if out := s.call(t, "fy__echo", `{"message":"watched"}`); !strings.Contains(out, "echo: watched") {
		t.Errorf("fy__echo after the config was written: %.400s", out)
	}
}
