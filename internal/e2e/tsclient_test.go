// Package e2e drives capgate end to end with clients nobody here wrote.
//
// The tests in tsclient_test.go run the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in tsclient/package-lock.json) through
// tsclient/client.mjs against `capgate serve` over streamable HTTP. They need
// node and npm: without npm they skip, unless $CI is set, where they fail.
// node_modules is not kept in the tree: it is installed with `npm ci` into
// $TMPDIR/capgate-tsclient/<hash of package-lock.json> and reused.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

func TestMain(m *testing.M) {
	testkit.Programs(testkit.CapgatePkg, testkit.MCPFixture)
	testkit.Main(m)
}

// TestTSClientAgainstFixture runs the client script against the MCP fixture
// itself (no capgate, no auth, no prefix): it proves the SDK, the script and
// progress notifications work, whatever state capgate's MCP front door is in.
func TestTSClientAgainstFixture(t *testing.T) {
	t.Parallel()
	dir := installTSClient(t)
	addr := testkit.FreeAddr(t)
	testkit.ServeMCPFixture(t, "-http", addr)

	rep := runTSClient(t, dir, "http://"+addr+"/mcp", "unused", "CAPGATE_TOOL_PREFIX=")
	t.Logf("negotiated protocol version %q with %v", rep.ProtocolVersion, rep.ServerInfo)
	if rep.ProtocolVersion == "" {
		t.Error("the SDK did not expose a negotiated protocol version")
	}
	for _, name := range []string{"echo", "slow", "t_00", "t_24"} {
		if !slices.Contains(rep.Tools, name) {
			t.Errorf("tools/list (all pages) lacks %q: %v", name, rep.Tools)
		}
	}
	if got := rep.Echo.text(); got != "echo: hi" || rep.Echo.IsError {
		t.Errorf("echo = %q (isError %v), want %q", got, rep.Echo.IsError, "echo: hi")
	}
	// The fixture is no gate: t_00 just answers.
	if got := rep.Denied.text(); got != "ok" || rep.Denied.IsError {
		t.Errorf("t_00 = %q (isError %v), want %q", got, rep.Denied.IsError, "ok")
	}
	checkProgress(t, rep, false)
	if len(rep.Progress) != 3 {
		t.Errorf("progress notifications = %+v, want the fixture's 3", rep.Progress)
	}
}

// TestTSClientCapgate runs the client against one `capgate serve`: none
// of its runs changes what another sees, and a serve's start (with its
// stdio upstream) costs about half a second of CPU.
func TestTSClientCapgate(t *testing.T) {
	t.Parallel()
	dir := installTSClient(t)
	cg := startCapgate(t)
	t.Run("calls", func(t *testing.T) { t.Parallel(); testCalls(t, dir, cg) })
	t.Run("bad token", func(t *testing.T) { t.Parallel(); testBadToken(t, dir, cg) })
	t.Run("narrow token", func(t *testing.T) { t.Parallel(); testNarrowToken(t, dir, cg) })
}

// testCalls: list, an allowed call, a denied call and progress through
// capgate, with a token minted by `capgate token mint`.
func testCalls(t *testing.T, dir string, cg *capgate) {
	tok := cg.mint(t, "--sub", "alice")

	rep := runTSClient(t, dir, cg.url, tok)
	t.Logf("negotiated protocol version %q with %v", rep.ProtocolVersion, rep.ServerInfo)
	for _, name := range []string{"fx__echo", "fx__slow", "fx__t_00"} {
		if !slices.Contains(rep.Tools, name) {
			t.Errorf("tools/list lacks %q (rye.fetch.* is granted): %v", name, rep.Tools)
		}
	}
	if got := rep.Echo.text(); got != "echo: hi" || rep.Echo.IsError {
		t.Errorf("fx__echo = %q (isError %v), want %q", got, rep.Echo.IsError, "echo: hi")
	}
	if !rep.Denied.IsError {
		t.Errorf("fx__t_00 (not granted) was not an error: %+v", rep.Denied)
	}
	for _, want := range []string{"permission_denied", "rye.execute.tool.mcp.fx.t_00"} {
		if !strings.Contains(rep.Denied.text(), want) {
			t.Errorf("fx__t_00's denial %q does not say %q", rep.Denied.text(), want)
		}
	}
	// The SDK speaks 2025-11-25 to capgate, which writes a call's stream
	// itself: every progress notification of the call on it, in order,
	// before the result, however the SDK's GET stream is doing.
	checkProgress(t, rep, true)
	// The SDK drops a progress notification that comes after its call's
	// result: all three arrive only when each came before it.
	if len(rep.Progress) != 3 {
		t.Errorf("progress notifications = %+v, want the fixture's 3, each before the result", rep.Progress)
	}
}

// testBadToken: a token capgate cannot verify is refused with
// 401 and a WWW-Authenticate challenge, so the SDK's connect fails: one that
// is not a token at all, and a well-formed one signed with another key.
// The SDK reports the very challenge capgate sends (a stand-in server's
// 401 proved that much before; capgate's own now does).
func testBadToken(t *testing.T, dir string, cg *capgate) {
	other := make([]byte, 32)
	rand.Read(other)
	for name, tok := range map[string]string{
		"malformed": "not-a-valid-token",
		"wrong key": cg.mintWith(t, hex.EncodeToString(other), "--sub", "alice"),
	} {
		t.Run(name, func(t *testing.T) {
			bad := runTSClientBadToken(t, dir, cg.url, tok)
			if bad.Status != http.StatusUnauthorized {
				t.Errorf("connect with a bad token: status %d, want 401 (%+v)", bad.Status, bad)
			}
			if !strings.HasPrefix(strings.ToLower(bad.WWWAuthenticate), "bearer") {
				t.Errorf("401 without a Bearer WWW-Authenticate challenge: %q (%+v)", bad.WWWAuthenticate, bad)
			}
			if sent := challenge(t, cg.url, tok); bad.WWWAuthenticate != sent {
				t.Errorf("the SDK reported the challenge %q, capgate sends %q", bad.WWWAuthenticate, sent)
			}
		})
	}
}

// challenge is the WWW-Authenticate header capgate's 401 carries for an
// initialize with tok.
func challenge(t *testing.T, url, tok string) string {
	t.Helper()
	resp := testkit.SessionRequest(t, http.MethodPost, strings.TrimSuffix(url, "/mcp"), tok, "",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an initialize with the token %q: %d, want 401", tok, resp.StatusCode)
	}
	return resp.Header.Get("WWW-Authenticate")
}

// testNarrowToken: a token whose caps allow fetching only
// echo lists only echo.
func testNarrowToken(t *testing.T, dir string, cg *capgate) {
	tok := cg.mint(t, "--sub", "alice",
		"--caps", "rye.fetch.tool.mcp.fx.echo", "--caps", "rye.execute.tool.mcp.fx.echo")
	rep := runTSClient(t, dir, cg.url, tok, "CAPGATE_SKIP_CALLS=1")
	if !slices.Equal(rep.Tools, []string{"fx__echo"}) {
		t.Errorf("tools/list with caps for echo only = %v, want [fx__echo]", rep.Tools)
	}
}

// checkProgress: the slow tool answered, and reported progress that went
// up. The MCP spec says progress MUST increase with each notification; with
// strictOrder false arrival out of order is only logged.
//
// Why the fixture gets strictOrder false: mcp-go v1.2.1's streamable HTTP
// server (which the fixture is) puts every notification of a session,
// progress included, on one session channel that both the POST's response
// stream and the standalone GET stream (which the TypeScript SDK opens)
// read from, so a call's progress is split between the two streams and
// their order between them is not kept. capgate writes a call's stream
// itself (server/streamcall.go), so through capgate the order is strict.
func checkProgress(t *testing.T, rep *clientReport, strictOrder bool) {
	t.Helper()
	if got := rep.Slow.text(); got != "done" || rep.Slow.IsError {
		t.Errorf("slow = %q (isError %v), want %q", got, rep.Slow.IsError, "done")
	}
	if len(rep.Progress) == 0 {
		t.Fatalf("no progress notification arrived for slow (http: %+v)", rep.HTTP)
	}
	var values []float64
	for _, p := range rep.Progress {
		values = append(values, p.Progress)
	}
	if !slices.IsSorted(values) || len(slices.Compact(slices.Clone(values))) != len(values) {
		msg := fmt.Sprintf("progress did not increase from one notification to the next: %v "+
			"(mcp-go splits a call's progress between the POST and GET streams)", values)
		if strictOrder {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
	slices.Sort(values)
	if len(slices.Compact(values)) != len(rep.Progress) {
		t.Errorf("progress values repeat: %+v", rep.Progress)
	}
}

// --- the client's report ---

type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	IsError           bool            `json:"isError"`
	StructuredContent json.RawMessage `json:"structuredContent"`
}

// text joins the result's text content.
func (r *toolResult) text() string {
	if r == nil {
		return ""
	}
	var parts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type httpExchange struct {
	Method          string `json:"method"`
	Status          int    `json:"status"`
	ContentType     string `json:"contentType"`
	WWWAuthenticate string `json:"wwwAuthenticate"`
}

type clientReport struct {
	ProtocolVersion string         `json:"protocolVersion"`
	ServerInfo      map[string]any `json:"serverInfo"`
	SessionID       string         `json:"sessionId"`
	Tools           []string       `json:"tools"`
	Echo            *toolResult    `json:"echo"`
	Denied          *toolResult    `json:"denied"`
	Slow            *toolResult    `json:"slow"`
	Progress        []struct {
		Progress float64 `json:"progress"`
		Total    float64 `json:"total"`
		Message  string  `json:"message"`
	} `json:"progress"`
	Terminated any            `json:"terminated"`
	HTTP       []httpExchange `json:"http"`
}

type badTokenReport struct {
	Error           string         `json:"error"`
	Name            string         `json:"name"`
	Status          int            `json:"status"`
	WWWAuthenticate string         `json:"wwwAuthenticate"`
	HTTP            []httpExchange `json:"http"`
}

// --- running the client ---

// tsclientSource is the directory with package.json, package-lock.json and
// client.mjs (tests run with the package directory as working directory).
const tsclientSource = "tsclient"

// installTSClient makes sure the client's node_modules is installed in the
// cache directory and that the current client.mjs is there, and returns the
// directory. It skips the test where it cannot run.
func installTSClient(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the TypeScript SDK client needs npm and node")
	}
	for _, prog := range []string{"node", "npm"} {
		if _, err := exec.LookPath(prog); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed, and CI is set: %v", prog, err)
			}
			t.Skipf("%s is not installed: %v", prog, err)
		}
	}
	installMu.Lock()
	defer installMu.Unlock()
	if installedDir == "" {
		dir, err := installNodeModules()
		if err != nil {
			t.Fatal(err)
		}
		installedDir = dir
	}
	return installedDir
}

var (
	installMu    sync.Mutex
	installedDir string
)

// clientScript is the name client.mjs is copied under, inside the cache
// directory, so that it resolves the cached node_modules.
const clientScript = "client.mjs"

func installNodeModules() (string, error) {
	lock, err := os.ReadFile(filepath.Join(tsclientSource, "package-lock.json"))
	if err != nil {
		return "", err
	}
	pkg, err := os.ReadFile(filepath.Join(tsclientSource, "package.json"))
	if err != nil {
		return "", err
	}
	script, err := os.ReadFile(filepath.Join(tsclientSource, clientScript))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(lock)
	root := filepath.Join(os.TempDir(), "capgate-tsclient")
	dir := filepath.Join(root, hex.EncodeToString(sum[:])[:16])
	stamp := filepath.Join(dir, ".installed")

	if _, err := os.Stat(stamp); err != nil {
		// Install into a fresh directory beside it, then rename it into
		// place, so that concurrent test binaries never see half of it.
		if err := os.MkdirAll(root, 0o755); err != nil {
			return "", err
		}
		stage, err := os.MkdirTemp(root, "stage-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(stage)
		for name, b := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
			if err := os.WriteFile(filepath.Join(stage, name), b, 0o644); err != nil {
				return "", err
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund",
			"--prefer-offline", "--loglevel=error")
		cmd.Dir = stage
		cmd.WaitDelay = 10 * time.Second
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("npm ci in %s: %v\n%s", stage, err, out)
		}
		if err := os.WriteFile(filepath.Join(stage, ".installed"), []byte(time.Now().Format(time.RFC3339)+"\n"), 0o644); err != nil {
			return "", err
		}
		if err := os.Rename(stage, dir); err != nil {
			// Someone else installed it first, or an unfinished directory
			// is in the way (no stamp): replace that one.
			if _, serr := os.Stat(stamp); serr != nil {
				os.RemoveAll(dir)
				if err := os.Rename(stage, dir); err != nil {
					return "", fmt.Errorf("installing the TypeScript client: %w", err)
				}
			}
		}
		fmt.Fprintf(os.Stderr, "e2e: npm ci of the TypeScript client took %v (cached in %s)\n",
			time.Since(start).Round(time.Millisecond), dir)
	}

	// client.mjs is not part of the hash: write the current one (atomically,
	// as concurrent runs may share the directory).
	tmp, err := os.CreateTemp(dir, ".client-*.mjs")
	if err != nil {
		return "", err
	}
	_, werr := tmp.Write(script)
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), filepath.Join(dir, clientScript))
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return "", werr
	}
	return dir, nil
}

// runNode runs client.mjs with env added and returns its stdout, stderr and
// exit error.
func runNode(t *testing.T, dir string, env ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", clientScript)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"CAPGATE_TOOL_PREFIX=fx__", "CAPGATE_BAD_TOKEN=", "CAPGATE_SKIP_CALLS=")
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err = cmd.Run()
	t.Logf("node client.mjs: %v", time.Since(start).Round(time.Millisecond))
	return out.Bytes(), errb.Bytes(), err
}

// runTSClient runs the client in its normal mode and returns its report.
func runTSClient(t *testing.T, dir, url, token string, env ...string) *clientReport {
	t.Helper()
	env = append([]string{"CAPGATE_MCP_URL=" + url, "CAPGATE_TOKEN=" + token}, env...)
	out, errb, err := runNode(t, dir, env...)
	if len(errb) > 0 {
		t.Logf("client stderr:\n%s", errb)
	}
	if err != nil {
		t.Fatalf("the TypeScript client failed: %v\nstdout: %s\nstderr: %s", err, out, errb)
	}
	var rep clientReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("the client's report: %v\n%s", err, out)
	}
	t.Logf("client report: %s", out)
	return &rep
}

// runTSClientBadToken runs the client in its bad-token mode with token
// (empty: a made-up one): its connect must fail.
func runTSClientBadToken(t *testing.T, dir, url, token string) *badTokenReport {
	t.Helper()
	out, errb, err := runNode(t, dir, "CAPGATE_MCP_URL="+url, "CAPGATE_TOKEN="+token, "CAPGATE_BAD_TOKEN=1")
	if err != nil {
		t.Fatalf("bad-token mode: %v (did it connect?)\nstdout: %s\nstderr: %s", err, out, errb)
	}
	var rep badTokenReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("the client's report: %v\n%s", err, out)
	}
	t.Logf("bad-token report: %s", out)
	return &rep
}

// --- running capgate ---

type capgate struct {
	bin, config, secret string
	url                 string // the MCP endpoint from the banner
}

var mcpLine = regexp.MustCompile(`^\s+MCP\s+(http://\S+/mcp)\s*$`)

// startCapgate starts `capgate serve` on a config with the MCP fixture as
// upstream "fx" and reads the MCP endpoint off its banner. The server is
// stopped at cleanup: SIGTERM, then SIGKILL after 10 s.
func startCapgate(t *testing.T) *capgate {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	s := testkit.StartCapgate(t, testkit.Capgate{Secret: hex.EncodeToString(key), Config: fmt.Sprintf(`
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.fx.echo", "rye.execute.tool.mcp.fx.slow"]

[mcp.servers.fx]
command = %q

[mcp.servers.fx.tools.echo]
risk = "LOW"

[mcp.servers.fx.tools.slow]
risk = "LOW"

[mcp.servers.fx.tools.t_00]
risk = "LOW"
`, testkit.Build(t, testkit.MCPFixture))})
	t.Cleanup(func() { s.Stop(t) })
	cg := &capgate{bin: s.Bin, config: s.ConfigPath, secret: s.Secret}
	for _, line := range strings.Split(s.Banner, "\n") {
		if m := mcpLine.FindStringSubmatch(line); m != nil {
			cg.url = m[1]
			break
		}
	}
	if cg.url == "" {
		t.Fatalf("capgate serve's banner named no MCP endpoint:\n%s", s.Banner)
	}
	if want := s.URL + "/mcp"; cg.url != want {
		t.Errorf("the banner's MCP endpoint is %s, want %s", cg.url, want)
	}
	if c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second); err != nil {
		t.Fatalf("the banner named %s, but %s does not accept connections: %v", cg.url, s.Addr, err)
	} else {
		c.Close()
	}
	return cg
}

// mint runs `capgate token mint --config F args...` and returns the token.
func (cg *capgate) mint(t *testing.T, args ...string) string {
	t.Helper()
	return cg.mintWith(t, cg.secret, args...)
}

// mintWith mints with the token key secret instead of the server's.
func (cg *capgate) mintWith(t *testing.T, secret string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cg.bin, append([]string{"token", "mint", "--config", cg.config}, args...)...)
	cmd.Env = append(os.Environ(), "CAPGATE_TOKEN_SECRET="+secret)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("capgate token mint %v: %v\nstdout: %s\nstderr: %s", args, err, out.String(), errb.String())
	}
	lines := strings.Fields(strings.TrimSpace(out.String()))
	if len(lines) == 0 {
		t.Fatalf("capgate token mint %v printed no token (stderr: %s)", args, errb.String())
	}
	return lines[len(lines)-1]
}
