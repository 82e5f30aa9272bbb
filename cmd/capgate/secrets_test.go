package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// The secrets in capgate's environment in these tests: capgate's own keys
// and one of the host's. None may reach a subprocess.
const (
	hostSecret   = "host-secret-value-Zq81xw"
	storeKeyHex  = "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7"
	operatorPass = "operator-value-Lm4kd"
	masterHex    = "9a1fd3c4b2e8a7f6019a1fd3c4b2e8a7f6019a1fd3c4b2e8a7f6019a1fd3c4b2"
)

// secretsServe is a capgate serve with one source of each kind, each of
// which reports the environment it was given: the extension command and
// the bridge provider write it to a file on every call, the stdio
// upstream (started with no cwd) when it starts.
type secretsServe struct {
	*served
	extEnv, bridgeCapture, mcpEnv string
}

func startSecretsServe(t *testing.T, auth string, env ...string) *secretsServe {
	t.Helper()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	// The files serve's subprocesses report to, and the extension pack.
	// (apart: no tool creates files beside its own pack, which the
	// sandbox carves out of its writes)
	own, packs := testkit.ToolDir(t), t.TempDir()
	s := &secretsServe{extEnv: filepath.Join(own, "ext.env"), bridgeCapture: filepath.Join(own, "bridge.json"), mcpEnv: filepath.Join(own, "mcp.json")}
	pack := filepath.Join(packs, "ext", "envpack")
	if err := os.MkdirAll(pack, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, text string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pack, "extension.yaml"), `id: envpack
name: Env
description: Reports the environment its command gets
commands:
  env:
    description: Write the environment to $EXT_ENV_FILE
    run: ["./env.sh"]
    risk: LOW
    side_effects: []
`, 0o644)
	write(filepath.Join(pack, "env.sh"), "#!/bin/sh\ncat >/dev/null\nenv > \"$EXT_ENV_FILE\"\necho '{\"ok\": true}'\n", 0o755)
	env = append([]string{
		"CAPGATE_STORE_KEY=" + storeKeyHex, "HOST_SECRET=" + hostSecret, "OPERATOR_PASS=" + operatorPass,
		"EXT_ENV_FILE=" + s.extEnv, "BRIDGE_FIXTURE_CAPTURE=" + s.bridgeCapture,
	}, env...)
	// The token secret is the test's to give (in env) or withhold.
	cg := testkit.StartCapgate(t, testkit.Capgate{Secret: masterHex, NoSecret: true, Env: env, Config: fmt.Sprintf(`%s
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.bridge.gog.*", "rye.execute.tool.mcp.fx.*", "rye.execute.tool.ext.*"]
acknowledge = ["elevated"]

[extensions]
paths = [%q]
env = ["OPERATOR_PASS", "EXT_ENV_FILE"]

[capabilities.providers.gog]
command = [%q]
env = ["OPERATOR_PASS", "BRIDGE_FIXTURE_CAPTURE"]

[mcp.servers.fx]
command = %q

[mcp.servers.fx.env]
FIXTURE_ENV_FILE = %q
OPERATOR_VALUE = "${OPERATOR_PASS:-unset}"
`, auth, filepath.Dir(pack), testkit.Build(t, testkit.BridgeFixture), testkit.Build(t, testkit.MCPFixture), s.mcpEnv)})
	s.served = fromCapgate(cg)
	banner := cg.Banner
	for _, secret := range []string{masterHex, storeKeyHex, hostSecret} {
		if strings.Contains(banner, secret) {
			t.Errorf("the banner shows a secret:\n%s", banner)
		}
	}
	return s
}

// envOf reads "K=V" lines (a JSON list, or env's output) into a map.
func envOf(t *testing.T, path string) (map[string]string, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the subprocess reported no environment: %v", err)
	}
	var lines []string
	if json.Unmarshal(b, &lines) != nil {
		lines = strings.Split(string(b), "\n")
	}
	m := map[string]string{}
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m, string(b)
}

// capture is what the bridge provider held on its last invoke.
type capture struct {
	Env   map[string]string
	Raw   string
	Token string
}

func (s *secretsServe) capture(t *testing.T) capture {
	t.Helper()
	b, err := os.ReadFile(s.bridgeCapture)
	if err != nil {
		t.Fatalf("the provider captured nothing: %v", err)
	}
	var c struct {
		Env          []string `json:"env"`
		ContextToken string   `json:"context_token"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	out := capture{Env: map[string]string{}, Raw: string(b), Token: c.ContextToken}
	for _, l := range c.Env {
		k, v, _ := strings.Cut(l, "=")
		out.Env[k] = v
	}
	return out
}

// rpc posts one capability RPC call and returns its error's data code
// ("" on success) and the whole answer.
func (s *served) rpc(t *testing.T, method, tok string, params map[string]any) (string, string) {
	t.Helper()
	p := map[string]any{"context_token": tok}
	for k, v := range params {
		p[k] = v
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": p})
	resp, err := http.Post("http://"+s.addr+"/rpc", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	var r struct {
		Error *struct {
			Message string
			Data    struct{ Code string }
		}
	}
	json.Unmarshal(buf.Bytes(), &r)
	text := buf.String()
	if len(text) > 300 {
		text = text[:300] + "..."
	}
	if r.Error == nil {
		return "", text
	}
	code := r.Error.Data.Code
	if code == "" {
		code, _, _ = strings.Cut(r.Error.Message, ":")
	}
	return code, text
}

// mcpStatus initializes an MCP session at /mcp with tok and returns the
// HTTP status.
func (s *served) mcpStatus(t *testing.T, tok string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, string(buf.Bytes()[:min(buf.Len(), 300)])
}

// stdioRefuses runs `capgate serve --stdio` as the caller of tok and
// reports whether it refused the token before serving.
func (s *served) stdioRefuses(t *testing.T, tok string) (bool, string) {
	t.Helper()
	cmd := exec.Command(s.bin, "serve", "--stdio", "--config", s.config)
	cmd.Env = append(os.Environ(), "CAPGATE_TOKEN="+tok, "CAPGATE_TOKEN_SECRET="+s.secret, "CAPGATE_STORE_KEY="+storeKeyHex)
	cmd.Stdin = strings.NewReader("")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	_, exited := err.(*exec.ExitError)
	return exited && strings.Contains(errb.String(), "token_invalid"), errb.String()
}

// TestSubprocessesGetNoSecrets: capgate's token key, its vault key and a
// host secret are in capgate's environment; the extension command, the
// bridge provider and the stdio upstream (no cwd) get none of them, and
// do get what the operator named for each.
func TestSubprocessesGetNoSecrets(t *testing.T) {
	t.Parallel()
	s := startSecretsServe(t, "", "CAPGATE_TOKEN_SECRET="+masterHex)
	alice := s.mint(t, "alice", "private")
	if out, errb, code := s.as(t, alice, "invoke", "--capability", "ext:envpack:env"); code != 0 {
		t.Fatalf("ext: %d %s %s", code, out, errb)
	}
	if out, errb, code := s.as(t, alice, "invoke", "--capability", "gog.calendar", "--operation", "list_events"); code != 0 {
		t.Fatalf("bridge: %d %s %s", code, out, errb)
	}
	ext, extRaw := envOf(t, s.extEnv)
	mcp, mcpRaw := envOf(t, s.mcpEnv)
	br := s.capture(t)
	for _, src := range []struct {
		name string
		env  map[string]string
		raw  string
		want map[string]string
	}{
		{"extension command", ext, extRaw, map[string]string{"OPERATOR_PASS": operatorPass}},
		{"bridge provider", br.Env, br.Raw, map[string]string{"OPERATOR_PASS": operatorPass}},
		{"stdio upstream", mcp, mcpRaw, map[string]string{"OPERATOR_VALUE": operatorPass, "FIXTURE_ENV_FILE": s.mcpEnv}},
	} {
		for _, name := range []string{"CAPGATE_TOKEN_SECRET", "CAPGATE_STORE_KEY", "HOST_SECRET"} {
			if _, ok := src.env[name]; ok {
				t.Errorf("the %s got %s", src.name, name)
			}
		}
		for _, v := range []string{masterHex, storeKeyHex, hostSecret} {
			if strings.Contains(src.raw, v) {
				t.Errorf("the %s got the value of a secret", src.name)
			}
		}
		for k, v := range src.want {
			if src.env[k] != v {
				t.Errorf("the %s: %s = %q, want %q (named by the operator)", src.name, k, src.env[k], v)
			}
		}
		if src.env["PATH"] == "" {
			t.Errorf("the %s got no PATH", src.name)
		}
	}
	// The provider's key is its own, not capgate's.
	if k := br.Env["ASH_CONTEXT_TOKEN_SECRET"]; k == "" || bytes.Equal(token.ParseSecret(k), token.ParseSecret(masterHex)) {
		t.Errorf("the bridge provider's key is missing or capgate's own")
	}
}

// TestBridgeKeyMintsNothing: a provider that turns attacker signs a token
// for "admin" with the key it was given; no front door of capgate takes
// it. The provider still verifies its own per-call token with that key.
func TestBridgeKeyMintsNothing(t *testing.T) {
	t.Parallel()
	s := startSecretsServe(t, "", "CAPGATE_TOKEN_SECRET="+masterHex)
	alice := s.mint(t, "alice", "private")
	out, errb, code := s.as(t, alice, "invoke", "--capability", "gog.calendar", "--operation", "list_events")
	if code != 0 || !strings.Contains(out, `"token_sub": "alice"`) {
		t.Fatalf("the provider did not verify its token with its key: %d %s %s", code, out, errb)
	}
	key := token.ParseSecret(s.capture(t).Env["ASH_CONTEXT_TOKEN_SECRET"])
	if len(key) == 0 {
		t.Fatal("the provider got no key")
	}
	for _, ash := range []bool{true, false} {
		forged, err := token.Mint(key, token.Claims{Sub: "admin", ChatType: "private", Audience: []string{"capgate"}}, token.MintOptions{Ash: ash})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := s.rpc(t, "capability.list", forged, nil); code != "token_invalid" {
			t.Errorf("/rpc took a token signed with a provider's key (ash %v): %s", ash, body)
		}
		if status, body := s.mcpStatus(t, forged); status != http.StatusUnauthorized {
			t.Errorf("/mcp took a token signed with a provider's key (ash %v): %d %s", ash, status, body)
		}
		if refused, errb := s.stdioRefuses(t, forged); !refused {
			t.Errorf("--stdio took a token signed with a provider's key (ash %v): %s", ash, errb)
		}
	}
	// The same forgery under capgate's key is accepted: the refusal is the key's.
	real, _ := token.Mint(token.ParseSecret(masterHex), token.Claims{Sub: "admin", Audience: []string{"capgate"}}, token.MintOptions{Ash: true})
	if code, body := s.rpc(t, "capability.list", real, nil); code != "" {
		t.Errorf("a token under capgate's key: %s", body)
	}
}

// TestBridgeTokenIsNarrowAndRefused: the per-call token a provider gets
// carries the caller's caps and ack and the provider's own audience, and
// replayed at capgate's front doors it is refused.
func TestBridgeTokenIsNarrowAndRefused(t *testing.T) {
	t.Parallel()
	s := startSecretsServe(t, "", "CAPGATE_TOKEN_SECRET="+masterHex)
	out, errb, code := s.run(t, []string{"CAPGATE_TOKEN_SECRET=" + masterHex}, "token", "mint", "--config", s.config, "--ash", "--sub", "alice",
		"--chat-type", "private", "--caps", "rye.fetch.*", "--caps", "rye.execute.tool.bridge.gog.calendar.*", "--ack", "elevated", "--ack", "unrestricted")
	if code != 0 {
		t.Fatalf("mint: %s", errb)
	}
	alice := strings.TrimSpace(out)
	if out, errb, code := s.as(t, alice, "invoke", "--capability", "gog.calendar", "--operation", "list_events"); code != 0 {
		t.Fatalf("invoke: %d %s %s", code, out, errb)
	}
	perCall := s.capture(t).Token
	parts := strings.Split(perCall, ".")
	if len(parts) != 3 {
		t.Fatalf("the provider got no token")
	}
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims struct {
		Sub  string
		Aud  any
		Caps []string
		Ack  []string
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	// caps: the calendar only (the policy allows email too, the token not);
	// ack: elevated (the token's unrestricted is not the policy's).
	if claims.Sub != "alice" || claims.Aud != "capgate-bridge:gog" ||
		!slices.Equal(claims.Caps, []string{"rye.execute.tool.bridge.gog.calendar.list_events"}) || !slices.Equal(claims.Ack, []string{"elevated"}) {
		t.Errorf("the per-call token's claims: %s", payload)
	}
	if code, body := s.rpc(t, "capability.list", perCall, nil); code != "token_invalid" {
		t.Errorf("/rpc took the replayed per-call token: %s", body)
	}
	if code, body := s.rpc(t, "capability.invoke", perCall, map[string]any{"capability": "gog.email", "operation": "send"}); code != "token_invalid" {
		t.Errorf("/rpc invoke took the replayed per-call token: %s", body)
	}
	if status, body := s.mcpStatus(t, perCall); status != http.StatusUnauthorized {
		t.Errorf("/mcp took the replayed per-call token: %d %s", status, body)
	}
	if refused, errb := s.stdioRefuses(t, perCall); !refused {
		t.Errorf("--stdio took the replayed per-call token: %s", errb)
	}
}

// TestJWKSOnlyRefusesHS256: with a JWKS and no allow_hs256, capgate makes
// no HS256 key and accepts no HS256 token, not even one under the key in
// its environment; an ES256 token from the JWKS is accepted, and bridge
// providers still verify their per-call tokens.
func TestJWKSOnlyRefusesHS256(t *testing.T) {
	t.Parallel()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	pub, _ := priv.PublicKey.Bytes() // 0x04 || X || Y
	b64 := base64.RawURLEncoding.EncodeToString
	doc, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{
		"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig", "x": b64(pub[1:33]), "y": b64(pub[33:]),
	}}})
	if err := os.WriteFile(jwks, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	// Once with the token variable set, once without (where capgate would
	// make a development key).
	for _, env := range [][]string{nil, {"CAPGATE_TOKEN_SECRET=" + masterHex}} {
		t.Run(fmt.Sprintf("env=%d", len(env)), func(t *testing.T) { jwksOnly(t, jwks, priv, env) })
	}
}

func jwksOnly(t *testing.T, jwks string, priv *ecdsa.PrivateKey, env []string) {
	b64 := base64.RawURLEncoding.EncodeToString
	s := startSecretsServe(t, fmt.Sprintf("\n[auth]\njwks_file = %q\n", jwks), env...)
	devKey := filepath.Join(s.dir, "data", "token.secret")
	keys := [][]byte{token.ParseSecret(masterHex)}
	if b, err := os.ReadFile(devKey); !os.IsNotExist(err) {
		t.Errorf("capgate serve made a development key under a JWKS: %v", err)
		keys = append(keys, token.ParseSecret(string(b)))
	}

	es256 := func(sub string) string {
		h := b64([]byte(`{"alg":"ES256","typ":"JWT","kid":"k1"}`))
		p, _ := json.Marshal(map[string]any{"sub": sub, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Minute).Unix(), "aud": "capgate", "chat_type": "private"})
		in := h + "." + b64(p)
		sum := sha256.Sum256([]byte(in))
		r, sg, err := ecdsa.Sign(rand.Reader, priv, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig := make([]byte, 64)
		r.FillBytes(sig[:32])
		sg.FillBytes(sig[32:])
		return in + "." + b64(sig)
	}
	alice := es256("alice")
	var out, errb string
	var code int
	if code, body := s.rpc(t, "capability.list", alice, nil); code != "" {
		t.Fatalf("an ES256 token from the JWKS: %s", body)
	}
	if status, body := s.mcpStatus(t, alice); status != http.StatusOK {
		t.Errorf("/mcp with an ES256 token: %d %s", status, body)
	}
	out, errb, code = s.as(t, alice, "invoke", "--capability", "gog.calendar", "--operation", "list_events")
	if code != 0 || !strings.Contains(out, `"token_sub": "alice"`) {
		t.Errorf("a provider under a JWKS-only capgate could not verify its token: %d %s %s", code, out, errb)
	}

	// HS256, JWT and Ash alike, under any key: one capgate's CLI mints
	// from CAPGATE_TOKEN_SECRET, and one capgate would have made.
	minted, errb, code := s.run(t, []string{"CAPGATE_TOKEN_SECRET=" + masterHex}, "token", "mint", "--sub", "alice", "--chat-type", "private")
	if code != 0 {
		t.Fatalf("mint: %s", errb)
	}
	hss := []string{strings.TrimSpace(minted)}
	for _, k := range keys {
		hss = append(hss, mintHS(t, k, false), mintHS(t, k, true))
	}
	for i, hs := range hss {
		if code, body := s.rpc(t, "capability.list", hs, nil); code != "token_invalid" {
			t.Errorf("/rpc took HS256 token %d: %s", i, body)
		}
		if status, body := s.mcpStatus(t, hs); status != http.StatusUnauthorized {
			t.Errorf("/mcp took HS256 token %d: %d %s", i, status, body)
		}
	}
	// token mint --config has no key to mint with, and says why.
	_, errb, code = s.run(t, nil, "token", "mint", "--config", s.config, "--sub", "alice")
	if code != 2 || !strings.Contains(errb, "allow_hs256") {
		t.Errorf("token mint --config under a JWKS: %d %s", code, errb)
	}
	if _, err := os.Stat(devKey); !os.IsNotExist(err) {
		t.Errorf("token mint made a development key under a JWKS: %v", err)
	}
}

func mintHS(t *testing.T, key []byte, ash bool) string {
	t.Helper()
	raw, err := token.Mint(key, token.Claims{Sub: "alice", ChatType: "private"}, token.MintOptions{Ash: ash})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestJWKSWithAllowHS256 takes both when the operator asks.
func TestJWKSWithAllowHS256(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := priv.PublicKey.Bytes()
	b64 := base64.RawURLEncoding.EncodeToString
	doc, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{"kty": "EC", "crv": "P-256", "kid": "k1", "x": b64(pub[1:33]), "y": b64(pub[33:])}}})
	os.WriteFile(jwks, doc, 0o600)
	s := startSecretsServe(t, fmt.Sprintf("\n[auth]\njwks_file = %q\nallow_hs256 = true\n", jwks), "CAPGATE_TOKEN_SECRET="+masterHex)
	hs, _ := token.Mint(token.ParseSecret(masterHex), token.Claims{Sub: "alice"}, token.MintOptions{Ash: true})
	if code, body := s.rpc(t, "capability.list", hs, nil); code != "" {
		t.Errorf("allow_hs256 = true refused an HS256 token: %s", body)
	}
}
