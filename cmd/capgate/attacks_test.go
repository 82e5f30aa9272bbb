package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// send sends req and returns the status and body.
func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// getHost sends GET url with the Host header host.
func getHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	return send(t, req)
}

// TestMetricsRefuseRebinding: a page whose DNS name was rebound to
// 127.0.0.1 asks a real serve's metrics listener for /metrics (which
// names every exposed tool) with its own Host; it is refused as the main
// listener refuses it, while a loopback Host is served.
func TestMetricsRefuseRebinding(t *testing.T) {
	metricsAddr := testkit.FreeAddr(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf("metrics_listen = %q\n", metricsAddr)})
	url := "http://" + metricsAddr + "/metrics"
	if status, body := getHost(t, url, metricsAddr); status != http.StatusOK || !strings.Contains(body, "capgate_") {
		t.Fatalf("GET /metrics with a loopback Host: %d, want 200 with capgate's metrics (the test proves nothing)", status)
	}
	for _, u := range []string{url, cg.URL + "/healthz"} {
		if status, body := getHost(t, u, "attacker.example"); status != http.StatusForbidden || strings.Contains(body, "capgate_") {
			t.Errorf("GET %s with Host attacker.example: %d %q, want 403", u, status, body)
		}
	}
}

// postAnonymous posts a stateless tools/call of name to serve's /mcp
// without a token and returns the status and body.
func postAnonymous(t *testing.T, base, name string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + name + `","arguments":{"text":"hi"},` + modernMeta + `}}`
	req, err := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name} {
		req.Header.Set(k, v)
	}
	return send(t, req)
}

// TestReloadKeepsRestartOnlyKeys: an [auth.anonymous] table added to a
// running serve's config and reloaded (SIGHUP) must not let tokenless
// calls in: the running value stays, and the log says a restart is
// needed. A grant changed in the same edit is applied.
func TestReloadKeepsRestartOnlyKeys(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	if status, _ := postAnonymous(t, s.URL, "fx__echo"); status != http.StatusUnauthorized {
		t.Fatalf("a tokenless call before the reload: %d, want 401", status)
	}
	s.write(t, fmt.Sprintf(reloadConfig, s.fixture)+`
[auth.anonymous]
sub = "anon"
grants = ["rye.fetch.*", "rye.execute.tool.*"]
`)
	s.hup(t)
	s.waitLog(t, "reload applied", 1)
	if !strings.Contains(s.Logs(), `msg="reload: a change needs a restart; the running value stays" key=auth.anonymous`) {
		t.Errorf("the reload did not log that auth.anonymous needs a restart:\n%s", s.Logs())
	}
	if status, body := postAnonymous(t, s.URL, "fx__echo"); status != http.StatusUnauthorized {
		t.Errorf("a tokenless call after reloading [auth.anonymous]: %d %.300s, want 401", status, body)
	}
	// The reload itself was applied: the policy's grants changed.
	s.write(t, strings.Replace(fmt.Sprintf(reloadConfig, s.fixture), "mcp.fx.*", "mcp.fx.nothing", 1)+`
[auth.anonymous]
sub = "anon"
grants = ["rye.fetch.*", "rye.execute.tool.*"]
`)
	s.hup(t)
	s.waitLog(t, "reload applied", 2)
	if out := s.call(t, "fx__echo", `{"text":"hi"}`); !strings.Contains(out, "permission_denied") {
		t.Errorf("the reload's new grants were not applied: %.300s", out)
	}
}

// TestSecondServeRefused: with a serve running, a second serve on its
// data dir whose start fails anyway (its port is in use) and one that
// could start (a free port) are both refused, naming the holder's pid;
// so is one on another data dir that names the same socket. The first
// serve's pid file and socket are untouched and it still answers.
func TestSecondServeRefused(t *testing.T) {
	t.Parallel()
	a := testkit.StartCapgate(t, testkit.Capgate{Socket: true})
	dataDir, pid := filepath.Join(a.Dir, "data"), strconv.Itoa(a.Cmd.Process.Pid)
	second := func(listen, dataDir string) string {
		t.Helper()
		cfg := filepath.Join(t.TempDir(), "capgate.toml")
		writeFile(t, cfg, fmt.Sprintf("[server]\nlisten = %q\ndata_dir = %q\nsocket = %q\n", listen, dataDir, a.Socket))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, a.Bin, "serve", "--config", cfg)
		cmd.Env = append(os.Environ(), "CAPGATE_TOKEN_SECRET="+a.Secret)
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Errorf("a second serve on %s (listen %s) started:\n%s", dataDir, listen, out)
		} else if err == nil {
			t.Errorf("a second serve on %s (listen %s) exited 0:\n%s", dataDir, listen, out)
		}
		return string(out)
	}
	for _, listen := range []string{a.Addr, testkit.FreeAddr(t)} {
		if out := second(listen, dataDir); !strings.Contains(out, "in use by another capgate serve") || !strings.Contains(out, "pid "+pid) {
			t.Errorf("a second serve on the data dir (listen %s) was not refused naming pid %s:\n%s", listen, pid, out)
		}
	}
	if out := second(testkit.FreeAddr(t), filepath.Join(t.TempDir(), "other")); !strings.Contains(out, "rpc socket") || !strings.Contains(out, "pid "+pid) {
		t.Errorf("a serve on another data dir naming the same socket was not refused naming pid %s:\n%s", pid, out)
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "capgate.pid")); err != nil || strings.TrimSpace(string(b)) != pid {
		t.Errorf("the first serve's pid file: %q %v, want %s", b, err, pid)
	}
	conn, err := net.Dial("unix", a.Socket)
	if err != nil {
		t.Fatalf("the first serve's socket: %v", err)
	}
	conn.Close()
	if status, _ := getHost(t, a.URL+"/healthz", a.Addr); status != http.StatusOK {
		t.Errorf("the first serve's /healthz: %d", status)
	}
}

// TestHostileShapesWithheld: through a real serve, an upstream hands the
// caller credentials in the shapes issue 24 found getting through: keys
// spelled token, secretKey, credentials, access_tokens, pass_word, or
// with a Cyrillic "а"; name/value pairs; Slack app, Google OAuth, Stripe
// test and restricted keys, and a percent-encoded JWT as values; a
// resource's token and a prompt's credentials. Each is withheld
// (capability_invalid_output naming the key or format, never the value).
// Ordinary words and counts (tokens_used, passage, a name/value pair of
// no credential) still reach the caller.
func TestHostileShapesWithheld(t *testing.T) {
	t.Parallel()
	s, _ := startHostile(t)
	tr, err := transport.NewStreamableHTTP("http://"+s.addr+"/mcp",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + s.mint(t, "alice", "private")}))
	if err != nil {
		t.Fatal(err)
	}
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
	call := func(tool string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = tool, args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s %v: %v", tool, args, err)
		}
		return res
	}
	withheld := func(what, secret, finding string, res *mcp.CallToolResult) {
		t.Helper()
		b, _ := json.Marshal(res)
		if !res.IsError || strings.Contains(string(b), secret) || !strings.Contains(string(b), "capability_invalid_output") || !strings.Contains(string(b), finding) {
			t.Errorf("%s reached the caller, or was not withheld naming %q: %s", what, finding, b)
		}
	}
	for _, key := range []string{"token", "secretKey", "credentials", "access_tokens", "pass_word", "p\u0430ssword"} {
		withheld("key "+key, mcpSecret, "("+key+")", call("hx__leak", map[string]any{"key": key}))
	}
	for _, tc := range []struct{ doc, secret, finding string }{
		{`{"env":[{"name":"HOME","value":"/root"},{"name":"DB_PASSWORD","value":"` + mcpSecret + `"}]}`, mcpSecret, "(DB_PASSWORD)"},
		{`{"note":"xapp-1-A0123-` + mcpSecret + `"}`, mcpSecret, "Slack token"},
		{`{"note":"ya29.` + mcpSecret + `-abcdefgh"}`, mcpSecret, "Google OAuth token"},
		{`{"note":"sk_test_4eC39HqLyjWDarjtT1zdp7dc"}`, "4eC39HqLyjWDarjtT1zdp7dc", "Stripe secret key"},
		{`{"note":"rk_live_4eC39HqLyjWDarjtT1zdp7dc"}`, "4eC39HqLyjWDarjtT1zdp7dc", "Stripe secret key"},
		{`{"next":"https://x.test/cb?t=eyJhbGciOiJIUzI1NiJ9%2EeyJzdWIiOiJhbGljZSJ9%2EhxSECRET4f1c9e27"}`, "hxSECRET4f1c9e27", "JSON Web Token"},
	} {
		withheld(tc.doc, tc.secret, tc.finding, call("hx__shape", map[string]any{"json": tc.doc}))
	}
	// Both directions: what names no credential is the caller's.
	for _, key := range []string{"tokens_used", "passage"} {
		if res := call("hx__leak", map[string]any{"key": key}); res.IsError || !strings.Contains(fmt.Sprint(res.StructuredContent), mcpSecret) {
			t.Errorf("key %s was withheld: %+v", key, res)
		}
	}
	if res := call("hx__shape", map[string]any{"json": `{"usage":{"tokens_used":1532,"tokens":40},"env":[{"name":"HOME","value":"/root"}]}`}); res.IsError {
		t.Errorf("ordinary counts and a name/value pair were withheld: %+v", res)
	}

	for uri, bad := range map[string]bool{"hx://token": true, "hx://usage": false} {
		req := mcp.ReadResourceRequest{}
		req.Params.URI = uri
		res, err := c.ReadResource(ctx, req)
		b, _ := json.Marshal(res)
		if bad && (err == nil || strings.Contains(string(b)+err.Error(), mcpSecret) || !strings.Contains(err.Error(), "(token)")) {
			t.Errorf("read %s: %v %s, want it withheld naming (token)", uri, err, b)
		}
		if !bad && (err != nil || !strings.Contains(string(b), "tokens_used")) {
			t.Errorf("read %s: %v %s, want it read", uri, err, b)
		}
	}
	for name, bad := range map[string]bool{"hx__creds": true, "hx__usage": false} {
		req := mcp.GetPromptRequest{}
		req.Params.Name = name
		res, err := c.GetPrompt(ctx, req)
		b, _ := json.Marshal(res)
		if bad && (err == nil || strings.Contains(string(b)+err.Error(), mcpSecret) || !strings.Contains(err.Error(), "(credentials)")) {
			t.Errorf("prompt %s: %v %s, want it withheld naming (credentials)", name, err, b)
		}
		if !bad && (err != nil || !strings.Contains(string(b), "passage")) {
			t.Errorf("prompt %s: %v %s, want it given", name, err, b)
		}
	}
}

// TestAuditTruncationDetected: a real serve writes its audit log; then
// the attacker cuts the last line off and rewrites .head to name the new
// last line (as issue 24 did), strips its MAC, forges one with another
// key, or removes .head. With capgate's key, `capgate audit verify` finds
// each; without it, the rewritten head passes, as the README says.
func TestAuditTruncationDetected(t *testing.T) {
	t.Parallel()
	s := startReload(t, "")
	for range 3 {
		if out := s.call(t, "fx__echo", `{"message":"hi"}`); strings.Contains(out, `"isError":true`) {
			t.Fatalf("a call: %s", out)
		}
	}
	if err := s.Stop(t); err != nil {
		t.Fatalf("serve: %v", err)
	}
	logPath := filepath.Join(s.Dir, "data", "audit.jsonl")
	orig, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	origHead, err := os.ReadFile(logPath + ".head")
	if err != nil || !strings.Contains(string(origHead), `"mac":"`) {
		t.Fatalf("serve's .head has no MAC: %q %v", origHead, err)
	}
	verify := func(withKey bool, args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(s.Bin, append([]string{"audit", "verify"}, args...)...)
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "CAPGATE_TOKEN_SECRET=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		if withKey {
			cmd.Env = append(cmd.Env, "CAPGATE_TOKEN_SECRET="+s.Secret)
		}
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := verify(true, "--config", s.ConfigPath); code != 0 || !strings.Contains(out, "verified with capgate's key") {
		t.Fatalf("the untouched log with the key: %d %s", code, out)
	}

	lines := strings.SplitAfter(strings.TrimSuffix(string(orig), "\n"), "\n")
	if len(lines) < 3 {
		t.Fatalf("serve wrote %d audit lines, want 3 or more", len(lines))
	}
	cut := strings.Join(lines[:len(lines)-1], "")
	last := strings.TrimSuffix(lines[len(lines)-2], "\n")
	sum := sha256.Sum256([]byte(last))
	rewritten := fmt.Sprintf(`{"seq":%d,"hash":"%x"}`+"\n", len(lines)-1, sum)
	wrongKey := audit.HeadKey([]byte("the attacker's guess at the key"))
	m := hmac.New(sha256.New, wrongKey)
	m.Write([]byte(fmt.Sprintf("capgate audit head v1\n%d\n%x", len(lines)-1, sum)))
	forged := fmt.Sprintf(`{"seq":%d,"hash":"%x","mac":"%x"}`+"\n", len(lines)-1, sum, m.Sum(nil))
	for _, tc := range []struct {
		name, head, want string
	}{
		{"rewritten without a MAC", rewritten, "has no MAC"},
		{"rewritten with a MAC of another key", forged, "MAC does not verify"},
		{"removed", "", "no audit.jsonl.head"},
	} {
		writeFile(t, logPath, cut)
		os.Remove(logPath + ".head")
		if tc.head != "" {
			writeFile(t, logPath+".head", tc.head)
		}
		if code, out := verify(true, "--config", s.ConfigPath); code != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("cut back, .head %s, verified with the key: %d %s, want exit 1 naming %q", tc.name, code, out, tc.want)
		}
		if code, out := verify(true, logPath); code != 1 || !strings.Contains(out, "BROKEN") {
			t.Errorf("cut back, .head %s, verify FILE with $CAPGATE_TOKEN_SECRET: %d %s, want BROKEN", tc.name, code, out)
		}
	}
	// Without the key the rewritten head cannot be told from a real one.
	writeFile(t, logPath+".head", rewritten)
	if code, out := verify(false, "--file", logPath); code != 0 || !strings.Contains(out, "checked without capgate's key") {
		t.Errorf("without the key: %d %s, want it to pass with the note", code, out)
	}
	// And a serve started on the cut log does not extend it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Bin, "serve", "--config", s.ConfigPath)
	cmd.Env = append(os.Environ(), "CAPGATE_TOKEN_SECRET="+s.Secret)
	if out, err := cmd.CombinedOutput(); ctx.Err() != nil || err == nil || !strings.Contains(string(out), "has no MAC") {
		t.Errorf("serve on the cut log: %v %s, want it refused naming the head", err, out)
	}
}

// TestSessionsBounded: 60 initialize calls against a real serve with
// max_sessions = 50 leave exactly 50 sessions held (capgate_mcp_sessions):
// the cap forgot 10, as none was idle long enough to expire. Once they are
// idle past session_idle_timeout none is held. The timeout is 4 s: every
// call must come before the first session expires (the 60 took 0.17 s at
// load 15; 41 of 300 once took over a second on a loaded machine).
func TestSessionsBounded(t *testing.T) {
	t.Parallel()
	metricsAddr := testkit.FreeAddr(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf("metrics_listen = %q\nsession_idle_timeout = \"4s\"\nmax_sessions = 50\n", metricsAddr)})
	tok := cg.Token(t, token.Claims{Sub: "alice"})
	held := func() float64 {
		return series(scrape(t, "http://"+metricsAddr+"/metrics"), "capgate_mcp_sessions", nil).GetGauge().GetValue()
	}
	for i := range 60 {
		testkit.OpenSession(t, cg.URL, tok, "{}")
		if i == 40 && held() != 41 {
			t.Fatalf("after 41 initialize calls %v sessions are held, want 41 (the gauge proves nothing)", held())
		}
	}
	if n := held(); n != 50 {
		t.Errorf("after 60 initialize calls %v sessions are held, want 50 (max_sessions)", n)
	}
	if !testkit.Poll(time.Minute, func() bool { return held() == 0 }) {
		t.Fatalf("%v sessions still held a minute after they went idle (session_idle_timeout 4s)", held())
	}
}
