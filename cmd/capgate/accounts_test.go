package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/authmcp"
	"github.com/capgate/capgate/internal/testkit/oauthas"
	"github.com/capgate/capgate/internal/testkit/pgtest"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
)

// oauthServe is a capgate serve whose [mcp.servers.tracker] is a real
// protected MCP server (authmcp) whose authorization server is a real
// oidc-provider, with auth = "oauth": each user signs in to their own
// account.
type oauthServe struct {
	*testkit.Served
	as  *oauthas.AS
	up  *authmcp.Server
	out []string // every response body a client got, for the leak check
	mu  sync.Mutex
	env []string // the CLI's environment beyond the test's
}

func startOAuthServe(t *testing.T) *oauthServe {
	t.Helper()
	as := oauthas.Shared(t)
	up := authmcp.Start(t, as.Issuer)
	addr := testkit.FreeAddr(t)
	return startOAuthReplica(t, as, up, addr, "http://"+addr, "", nil)
}

// startOAuthReplica starts a capgate serve on addr whose users sign in
// through publicURL, with more config (a shared [store]), env, and more
// [server] lines.
func startOAuthReplica(t *testing.T, as *oauthas.AS, up *authmcp.Server, addr, publicURL, more string, env []string, server ...string) *oauthServe {
	t.Helper()
	s := testkit.StartCapgate(t, testkit.Capgate{Addr: addr, Env: env, Secret: "oauth-replicas-secret-0123456789ab",
		Server: strings.Join(append([]string{fmt.Sprintf("public_url = %q", publicURL)}, server...), "\n"),
		Config: authServerConfig("tracker", up.URL, "oauth") + more})
	return &oauthServe{Served: s, as: as, up: up, env: env}
}

// authServerConfig is an audited config with one upstream, name at url
// with auth, whose whoami every caller may call.
func authServerConfig(name, url, auth string) string {
	return fmt.Sprintf(`[audit]
path = "audit.jsonl"
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.mcp.%[1]s.*"]
[mcp.servers.%[1]s]
url = %[2]q
auth = %[3]q
[mcp.servers.%[1]s.tools.whoami]
risk = "LOW"
`, name, url, auth)
}

func (o *oauthServe) keep(b []byte) {
	o.mu.Lock()
	o.out = append(o.out, string(b))
	o.mu.Unlock()
}

func (o *oauthServe) tok(t *testing.T, sub string) string {
	return o.Token(t, token.Claims{Sub: sub})
}

// cli runs capgate with args against the serve's config.
func (o *oauthServe) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(o.Bin, append(args, "--config", o.ConfigPath)...)
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), o.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("capgate %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	o.keep(out)
	t.Logf("$ capgate %s\n%s", strings.Join(args, " "), out)
	return string(out)
}

var linkRe = regexp.MustCompile(`http://[^\s"\\]+/oauth/link/caf_[0-9a-f]{32}`)

// invoke calls whoami over /rpc as sub; it returns the subject upstream
// and the error code and auth_url of a refusal.
func (o *oauthServe) invoke(t *testing.T, sub, note string) (who, code, authURL string) {
	t.Helper()
	return o.invokeCap(t, sub, "mcp:tracker:whoami", note)
}

// invokeCap is invoke of another server's whoami (capability).
func (o *oauthServe) invokeCap(t *testing.T, sub, capability, note string) (who, code, authURL string) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"capability.invoke","params":{"context_token":%q,"capability":%q,"input":{"note":%q}}}`,
		o.tok(t, sub), capability, note)
	resp0, err := http.Post(o.URL+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp0.Body)
	resp0.Body.Close()
	o.keep(raw)
	if resp0.StatusCode != 200 {
		t.Fatalf("/rpc: %d %s", resp0.StatusCode, raw)
	}
	var resp struct {
		Result struct {
			Structured struct{ Sub, Note string } `json:"output"`
		}
		Error *struct {
			Data struct {
				Code    string `json:"code"`
				AuthURL string `json:"auth_url"`
			}
		}
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatalf("/rpc answered %s", raw)
	}
	if resp.Error != nil {
		if resp.Error.Data.Code != "capability_auth_required" {
			t.Logf("/rpc as %s: %s", sub, raw)
		}
		return "", resp.Error.Data.Code, resp.Error.Data.AuthURL
	}
	if resp.Result.Structured.Note != note {
		t.Errorf("/rpc: the note %q came back as %q: %s", note, resp.Result.Structured.Note, raw)
	}
	return resp.Result.Structured.Sub, "", ""
}

// mcpCall calls whoami over MCP (2025-11-25, session sid) as sub.
func (o *oauthServe) mcpCall(t *testing.T, sub, sid, note string) (who, code, authURL, text string) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tracker__whoami","arguments":{"note":%q}}}`, note)
	status, _, raw := testkit.PostSession(t, o.URL, o.tok(t, sub), sid, body)
	return o.callAnswer(t, status, raw, note)
}

// modernCall calls whoami over MCP 2026-07-28 (no session) as sub.
func (o *oauthServe) modernCall(t *testing.T, sub, note string) (who, code, authURL, text string) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tracker__whoami","arguments":{"note":%q},`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},`+
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`, note)
	status, _, raw := testkit.PostMCP(t, o.URL, o.tok(t, sub), "tracker__whoami", body)
	return o.callAnswer(t, status, raw, note)
}

// callAnswer reads an MCP tools/call answer of whoami: the subject
// upstream, or the error code and auth_url of a refusal.
func (o *oauthServe) callAnswer(t *testing.T, status int, raw []byte, note string) (who, code, authURL, text string) {
	t.Helper()
	o.keep(raw)
	if status != 200 {
		t.Fatalf("/mcp: %d %s", status, raw)
	}
	raw = sseData(raw)
	var resp struct {
		Result struct {
			IsError           bool                       `json:"isError"`
			StructuredContent struct{ Sub, Note string } `json:"structuredContent"`
			Content           []struct{ Text string }    `json:"content"`
			Meta              struct {
				Error struct {
					Code    string `json:"code"`
					AuthURL string `json:"auth_url"`
				} `json:"capgate/error"`
			} `json:"_meta"`
		}
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatalf("/mcp answered %s", raw)
	}
	if len(resp.Result.Content) > 0 {
		text = resp.Result.Content[0].Text
	}
	if resp.Result.IsError {
		e := resp.Result.Meta.Error
		return "", e.Code, e.AuthURL, text
	}
	if resp.Result.StructuredContent.Note != note {
		t.Errorf("/mcp: the note %q came back as %q", note, resp.Result.StructuredContent.Note)
	}
	return resp.Result.StructuredContent.Sub, "", "", text
}

// sseData is the JSON of a response that may come as one SSE event.
func sseData(raw []byte) []byte {
	s := string(raw)
	if !strings.HasPrefix(s, "event:") && !strings.HasPrefix(s, "data:") && !strings.Contains(s, "\ndata:") {
		return raw
	}
	for _, line := range strings.Split(s, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(d, `"id":2`) {
			return []byte(d)
		}
	}
	return raw
}

// TestUpstreamOAuthLinkAndCall: with a real oidc-provider and a protected
// MCP server, users link their own accounts (CLI link, then /rpc's
// auth_url, then the 2025-11-25 tool error's link), every call carries
// the caller's own token in the caller's own upstream session, calls of
// two users interleaved over MCP and /rpc never cross, revoke ends one
// user's access only, and no token, refresh token or verifier is in any
// response, log line or audit record.
func TestUpstreamOAuthLinkAndCall(t *testing.T) {
	t.Parallel()
	as := oauthas.Shared(t)
	up := authmcp.Start(t, as.Issuer)
	addr, metricsAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	rc := startReceiver(t) // capgate's spans, for the leak check
	o := startOAuthReplica(t, as, up, addr, "http://"+addr, "",
		[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="},
		fmt.Sprintf("metrics_listen = %q", metricsAddr))

	// Before anyone links, the upstream lists nothing and a call is not
	// found; the operator's CLI prints alice's link.
	if out := o.cli(t, "tools", "list", "--source", "mcp"); !strings.Contains(out, "tracker: needs sign-in: no one has linked an account yet") {
		t.Errorf("tools list before anyone linked:\n%s", out)
	}
	out := o.cli(t, "accounts", "link", "tracker", "--sub", "alice")
	link := linkRe.FindString(out)
	if link == "" {
		t.Fatalf("accounts link printed no link:\n%s", out)
	}
	if status, page := o.as.Visit(t, "alice-upstream", link); status != 200 || !strings.Contains(page, "<b>alice</b> is now linked to account <b>alice-upstream</b>") {
		t.Fatalf("alice's callback page: %d\n%s", status, page)
	}

	// The catalog lists tracker once someone has linked.
	deadline := time.Now().Add(30 * time.Second)
	for {
		who, code, _ := o.invokeQuiet(t, "alice")
		if who == "alice-upstream" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's call after linking: %q %q\n%s", who, code, o.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// tools list: listed with alice's credential, linked for her only.
	if out := o.cli(t, "tools", "list", "--source", "mcp", "--sub", "alice"); !regexp.MustCompile(`tracker__whoami .*available, linked`).MatchString(out) {
		t.Errorf("tools list --sub alice:\n%s", out)
	}
	if out := o.cli(t, "tools", "list", "--source", "mcp", "--sub", "bob"); !regexp.MustCompile(`tracker__whoami .*available, needs sign-in`).MatchString(out) {
		t.Errorf("tools list --sub bob:\n%s", out)
	}

	// bob has no account: /rpc answers capability_auth_required with his
	// own link; after he signs in his calls are his.
	_, code, authURL := o.invoke(t, "bob", "b1")
	if code != "capability_auth_required" || !linkRe.MatchString(authURL) {
		t.Fatalf("bob unlinked over /rpc: code %q auth_url %q", code, authURL)
	}
	if status, page := o.as.Visit(t, "bob-upstream", authURL); status != 200 || !strings.Contains(page, "<b>bob</b> is now linked") {
		t.Fatalf("bob's callback page: %d\n%s", status, page)
	}
	if who, code, _ := o.invoke(t, "bob", "b2"); who != "bob-upstream" {
		t.Fatalf("bob over /rpc: %q %q", who, code)
	}

	// carol, over MCP 2025-11-25 without URL elicitation: a tool error
	// whose text carries the link and whose _meta says
	// capability_auth_required with auth_url.
	carolSID := testkit.OpenSession(t, o.URL, o.tok(t, "carol"), "{}")
	_, code, authURL, text := o.mcpCall(t, "carol", carolSID, "c1")
	if code != "capability_auth_required" || !linkRe.MatchString(authURL) || !strings.Contains(text, authURL) {
		t.Fatalf("carol unlinked over MCP: code %q auth_url %q text %q", code, authURL, text)
	}
	if status, _ := o.as.Visit(t, "carol-upstream", authURL); status != 200 {
		t.Fatalf("carol's callback: %d", status)
	}
	if who, code, _, _ := o.mcpCall(t, "carol", carolSID, "c2"); who != "carol-upstream" {
		t.Fatalf("carol over MCP after linking: %q %q", who, code)
	}

	// alice and bob, interleaved over MCP (2025-11-25 sessions and
	// 2026-07-28 requests) and /rpc at once: every answer is the caller's
	// own account, and no upstream session sees two.
	sids := map[string]string{"alice": testkit.OpenSession(t, o.URL, o.tok(t, "alice"), "{}"),
		"bob": testkit.OpenSession(t, o.URL, o.tok(t, "bob"), "{}")}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := range 8 {
		for _, sub := range []string{"alice", "bob"} {
			wg.Go(func() {
				note := fmt.Sprintf("%s-%d", sub, i)
				if who, code, _, _ := o.mcpCall(t, sub, sids[sub], note); who != sub+"-upstream" {
					errs <- fmt.Sprintf("MCP call %s as %s answered as %q (%s)", note, sub, who, code)
				}
				if who, code, _ := o.invoke(t, sub, note); who != sub+"-upstream" {
					errs <- fmt.Sprintf("/rpc call %s as %s answered as %q (%s)", note, sub, who, code)
				}
				if who, code, _, _ := o.modernCall(t, sub, note); who != sub+"-upstream" {
					errs <- fmt.Sprintf("2026-07-28 call %s as %s answered as %q (%s)", note, sub, who, code)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if mixed := o.up.Mixed(); len(mixed) > 0 {
		t.Errorf("upstream sessions used with two users' tokens: %v", mixed)
	}

	// The upstream refuses alice's held token (401): capgate refreshes it
	// once and the call goes through; when the refreshed one is refused
	// too, alice is asked to sign in again.
	o.up.Invalidate(o.heldToken(t, "alice"))
	if who, code, _ := o.invoke(t, "alice", "after-401"); who != "alice-upstream" {
		t.Fatalf("alice after a 401: %q %q", who, code)
	}
	o.up.Refuse("alice-upstream", true)
	if _, code, authURL := o.invoke(t, "alice", "refused"); code != "capability_auth_required" || !linkRe.MatchString(authURL) {
		t.Fatalf("alice refused after the refresh: %q %q", code, authURL)
	}
	o.up.Refuse("alice-upstream", false)
	link = linkRe.FindString(o.cli(t, "accounts", "link", "tracker", "--sub", "alice"))
	if status, _ := o.as.Visit(t, "alice-upstream", link); status != 200 {
		t.Fatalf("alice linking again: %d", status)
	}
	if who, code, _ := o.invoke(t, "alice", "relinked"); who != "alice-upstream" {
		t.Fatalf("alice after linking again: %q %q", who, code)
	}

	// What a held grant looks like in the store, for the leak check.
	secrets := o.up.Tokens()
	secrets = append(secrets, o.storedSecrets(t, "alice", "bob", "carol")...)

	// accounts list shows alice linked; revoke ends hers only.
	if out := o.cli(t, "accounts", "list", "--sub", "alice"); !regexp.MustCompile(`tracker\s+oauth\s+linked\s+alice-upstream`).MatchString(out) {
		t.Errorf("accounts list:\n%s", out)
	}
	if out := o.cli(t, "accounts", "revoke", "tracker", "--sub", "alice"); !strings.Contains(out, "the authorization server revoked its tokens") {
		t.Errorf("accounts revoke:\n%s", out)
	}
	if _, code, authURL := o.invoke(t, "alice", "a-after"); code != "capability_auth_required" || authURL == "" {
		t.Errorf("alice after revoke: %q %q", code, authURL)
	}
	if who, _ := o.invokeQuietNote(t, "bob"); who != "bob-upstream" {
		t.Errorf("bob after alice's revoke: %q", who)
	}

	// No token, refresh token, client secret or verifier anywhere a
	// client, the log or the audit can see.
	audit, _ := os.ReadFile(filepath.Join(o.Dir, "audit.jsonl"))
	if len(audit) == 0 {
		t.Fatal("no audit records")
	}
	seen := map[string]string{"serve's log": o.Logs(), "the audit log": string(audit)}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "tracker__whoami") {
		t.Fatalf("the metrics have no series of the calls:\n%.2000s", metrics)
	}
	seen["the metrics"] = string(metrics)
	var spans []string
	testkit.Poll(15*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		spans = spans[:0]
		for _, s := range rc.spans {
			spans = append(spans, s.String())
		}
		return strings.Contains(strings.Join(spans, "\n"), "tracker__whoami")
	})
	if len(spans) == 0 {
		t.Fatal("no spans of the calls were exported")
	}
	seen["the spans"] = strings.Join(spans, "\n")
	o.mu.Lock()
	seen["the responses"] = strings.Join(o.out, "\n")
	o.mu.Unlock()
	for where, text := range seen {
		for _, s := range secrets {
			if len(s) >= 16 && strings.Contains(text, s) {
				t.Errorf("%s carries a secret (%.12s...)", where, s)
			}
		}
	}
}

// invokeQuiet is invoke for a poll: a refusal is an answer, not a failure.
func (o *oauthServe) invokeQuiet(t *testing.T, sub string) (string, string, string) {
	return o.invoke(t, sub, "poll")
}

func (o *oauthServe) invokeQuietNote(t *testing.T, sub string) (string, string) {
	who, code, _ := o.invoke(t, sub, "after")
	return who, code
}

// heldToken is the access token the store holds for sub.
func (o *oauthServe) heldToken(t *testing.T, sub string) string {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(o.Dir, "data"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	raw, err := st.Credential(context.Background(), sub, "oauth "+o.as.Issuer, o.up.URL)
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		AccessToken string `json:"access_token"`
	}
	json.Unmarshal(raw, &g)
	return g.AccessToken
}

// storedSecrets reads the tokens the store holds for subs and the PKCE
// verifiers of open flows: what must never be seen outside it.
func (o *oauthServe) storedSecrets(t *testing.T, subs ...string) []string {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(o.Dir, "data"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out []string
	for _, sub := range subs {
		raw, err := st.Credential(context.Background(), sub, "oauth "+o.as.Issuer, o.up.URL)
		if err != nil {
			t.Fatalf("%s's grant: %v", sub, err)
		}
		var g map[string]any
		json.Unmarshal(raw, &g)
		for _, k := range []string{"access_token", "refresh_token"} {
			if v, _ := g[k].(string); v != "" {
				out = append(out, v)
			} else if k == "refresh_token" {
				t.Errorf("%s's grant holds no refresh token", sub)
			}
		}
	}
	return out
}

// TestUpstreamOAuthReplicas: two replicas on one PostgreSQL store. alice
// links through replica a (its callback), and replica b, started after,
// lists the server with her credential and serves her calls with her
// token; bob, refused on b, signs in through a's link and b then serves
// him; a revoke through b's config ends alice's access on a.
func TestUpstreamOAuthReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.Start(t)
	as := oauthas.Shared(t)
	up := authmcp.Start(t, as.Issuer)
	env := []string{"CAPGATE_STORE_KEY=" + strings.Repeat("a7", 32)}
	more := fmt.Sprintf("[store]\nurl = %q\n", url)
	addrA := testkit.FreeAddr(t)
	a := startOAuthReplica(t, as, up, addrA, "http://"+addrA, more, env)

	link := linkRe.FindString(a.cli(t, "accounts", "link", "tracker", "--sub", "alice"))
	if status, _ := as.Visit(t, "alice-upstream", link); status != 200 {
		t.Fatalf("alice's callback on a: %d", status)
	}
	b := startOAuthReplica(t, as, up, testkit.FreeAddr(t), "http://"+addrA, more, env)
	if who, code, _ := b.invoke(t, "alice", "on-b"); who != "alice-upstream" {
		t.Fatalf("alice on b: %q %q\n%s", who, code, b.Logs())
	}
	_, code, authURL := b.invoke(t, "bob", "b1")
	if code != "capability_auth_required" || !strings.HasPrefix(authURL, "http://"+addrA+"/oauth/link/") {
		t.Fatalf("bob unlinked on b: %q %q", code, authURL)
	}
	if status, _ := as.Visit(t, "bob-upstream", authURL); status != 200 {
		t.Fatalf("bob's callback on a: %d", status)
	}
	if who, code, _ := b.invoke(t, "bob", "b2"); who != "bob-upstream" {
		t.Fatalf("bob on b after linking through a: %q %q", who, code)
	}
	if out := b.cli(t, "accounts", "revoke", "tracker", "--sub", "alice"); !strings.Contains(out, "revoked alice's account") {
		t.Fatalf("revoke through b: %s", out)
	}
	if _, code, _ := a.invoke(t, "alice", "a-after"); code != "capability_auth_required" {
		t.Errorf("alice on a after the revoke through b: %q", code)
	}
	if mixed := up.Mixed(); len(mixed) > 0 {
		t.Errorf("upstream sessions with two users' tokens: %v", mixed)
	}
}
