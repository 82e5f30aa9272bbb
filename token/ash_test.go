package token

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// pythonMint runs testdata/ash_mint.py, which mints as Ash does, with
// claims on stdin.
func pythonMint(t *testing.T, secret []byte, claims map[string]any) string {
	t.Helper()
	return pythonMintAll(t, secret, []map[string]any{claims})[0]
}

// ashTokens are ashCases minted by ash_mint.py, once for the tests that
// need them (a Python start costs seconds on a busy machine).
var ashTokens = struct {
	sync.Mutex
	toks []string
}{}

func ashCaseTokens(t *testing.T) []string {
	t.Helper()
	ashTokens.Lock()
	defer ashTokens.Unlock()
	if ashTokens.toks == nil {
		var claims []map[string]any
		for _, tc := range ashCases() {
			claims = append(claims, tc.py)
		}
		ashTokens.toks = pythonMintAll(t, testSecret, claims)
	}
	return ashTokens.toks
}

// pythonMintAll is pythonMint for many claim sets, in one run.
func pythonMintAll(t *testing.T, secret []byte, claims []map[string]any) []string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatalf("python3 is needed for the Ash interop test in CI: %v", err)
		}
		t.Skipf("python3 not found: %v", err)
	}
	in, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "testdata/ash_mint.py", hex.EncodeToString(secret))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ash_mint.py: %v\n%s", err, stderr.String())
	}
	toks := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(toks) != len(claims) {
		t.Fatalf("ash_mint.py printed %d tokens for %d claim sets", len(toks), len(claims))
	}
	return toks
}

// ashCases are claim sets as Ash writes them, with the same claims for Mint.
func ashCases() []struct {
	name string
	py   map[string]any
	c    Claims
} {
	iat, exp := testNow.Add(-5*time.Second), testNow.Add(295*time.Second)
	base := func(extra map[string]any) map[string]any {
		m := map[string]any{"sub": testSub, "iat": iat.Unix(), "exp": exp.Unix(), "jti": "9f86d081884c7d659a2feaa0c55ad015"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	return []struct {
		name string
		py   map[string]any
		c    Claims
	}{
		{"minimal", base(nil), Claims{Sub: testSub, IssuedAt: iat, ExpiresAt: exp, ID: "9f86d081884c7d659a2feaa0c55ad015"}},
		{"all optional claims", base(map[string]any{
			"chat_id": "-1001234567890", "chat_type": "supergroup", "chat_title": `Ops "war room" <prod> & café ☕ 🚀 ` + "\u007f\u2028\x01",
			"provider": "telegram", "session_key": "telegram:-1001234567890:77", "thread_id": "77",
			"source_username": "alice_ops", "source_display_name": "Alice\tO'Neil\n\\ Ωmega", "message_id": "4242",
			"timezone": "America/Argentina/Buenos_Aires",
		}), Claims{
			Sub: testSub, IssuedAt: iat, ExpiresAt: exp, ID: "9f86d081884c7d659a2feaa0c55ad015",
			ChatID: "-1001234567890", ChatType: "supergroup", ChatTitle: `Ops "war room" <prod> & café ☕ 🚀 ` + "\u007f\u2028\x01",
			Provider: "telegram", SessionKey: "telegram:-1001234567890:77", ThreadID: "77",
			SourceUsername: "alice_ops", SourceDisplayName: "Alice\tO'Neil\n\\ Ωmega", MessageID: "4242",
			Timezone: "America/Argentina/Buenos_Aires",
		}},
		{"capgate claims", base(map[string]any{
			"caps": []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}, "ack": []string{"elevated", "write"}, "aud": "capgate", "chat_type": "private",
		}), Claims{
			Sub: testSub, IssuedAt: iat, ExpiresAt: exp, ID: "9f86d081884c7d659a2feaa0c55ad015", ChatType: "private",
			Caps: []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}, Ack: []string{"elevated", "write"}, Audience: []string{"capgate"},
		}},
	}
}

func TestAshPythonTokenVerifies(t *testing.T) {
	t.Parallel()
	v := newHS(t, func(o *Options) { o.Audience = "capgate" })
	toks := ashCaseTokens(t)
	for i, tc := range ashCases() {
		t.Run(tc.name, func(t *testing.T) {
			tok := toks[i]
			got, err := v.Verify(tok)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.c) {
				t.Errorf("claims\n got %+v\nwant %+v", *got, tc.c)
			}
		})
	}
}

func TestAshMintMatchesPython(t *testing.T) {
	t.Parallel()
	toks := ashCaseTokens(t)
	for i, tc := range ashCases() {
		t.Run(tc.name, func(t *testing.T) {
			want := toks[i]
			got, err := Mint(testSecret, tc.c, MintOptions{Ash: true})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("Mint differs from Ash\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestAshPythonDefaults(t *testing.T) {
	t.Parallel()
	// The script's own iat/exp/jti, from the real clock.
	tok := pythonMint(t, testSecret, map[string]any{"sub": testSub, "chat_id": "1"})
	v, err := NewVerifier(Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.ExpiresAt.Sub(c.IssuedAt) != 300*time.Second || len(c.ID) != 32 || c.ChatID != "1" {
		t.Errorf("claims %+v", c)
	}
	refused(t, newHS(t, func(o *Options) { o.Secret = []byte("not-the-secret-at-all") }), tok, ReasonSignature)
}
