package main

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/token"
)

// mintCLI runs "capgate token mint ARGS..." in process.
func mintCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"token", "mint"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// unsetenv removes key for the test and restores it afterwards.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	os.Unsetenv(key)
}

// verifyCLIToken checks that stdout is one token and a newline, and
// verifies it with secret.
func verifyCLIToken(t *testing.T, stdout string, secret []byte, audience string) (*token.Claims, string) {
	t.Helper()
	if strings.Count(stdout, "\n") != 1 || !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("stdout is not one line: %q", stdout)
	}
	tok := strings.TrimSuffix(stdout, "\n")
	v, err := token.NewVerifier(token.Options{Secret: secret, Audience: audience})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatalf("the minted token does not verify: %v", err)
	}
	hdr, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[0])
	if err != nil {
		t.Fatal(err)
	}
	return c, string(hdr)
}

func TestTokenMint(t *testing.T) {
	secret := []byte("cli-test-secret-0123456789abcdef")
	t.Setenv("CAPGATE_TOKEN_SECRET", hex.EncodeToString(secret))
	unsetenv(t, "ASH_CONTEXT_TOKEN_SECRET")

	before := time.Now().Add(-time.Second)
	stdout, stderr, code := mintCLI(t, "--sub", "telegram:42", "--chat-type", "private", "--chat-id", "42",
		"--caps", "rye.execute.tool.mcp.filesystem.*", "--caps", "rye.fetch.*", "--ack", "elevated",
		"--aud", "capgate", "--ttl", "10m", "--ash")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	c, hdr := verifyCLIToken(t, stdout, secret, "capgate")
	// stderr says when the token expires, as its exp claim does.
	if want := "token expires " + c.ExpiresAt.UTC().Format(time.RFC3339) + " (in 10m0s)\n"; stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	if hdr != `{"alg":"HS256","typ":"ASH_CONTEXT","ver":1}` {
		t.Errorf("header %s, want Ash's", hdr)
	}
	if c.Sub != "telegram:42" || c.ChatType != "private" || c.ChatID != "42" ||
		!reflect.DeepEqual(c.Caps, []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}) ||
		!reflect.DeepEqual(c.Ack, []string{"elevated"}) || !reflect.DeepEqual(c.Audience, []string{"capgate"}) {
		t.Errorf("claims %+v", c)
	}
	if c.ExpiresAt.Sub(c.IssuedAt) != 10*time.Minute || c.IssuedAt.Before(before.Truncate(time.Second)) || len(c.ID) != 32 {
		t.Errorf("iat %v exp %v jti %q", c.IssuedAt, c.ExpiresAt, c.ID)
	}

	// Without --ash: a JWT, the default TTL, no capgate claims.
	stdout, stderr, code = mintCLI(t, "--sub", "alice")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	c, hdr = verifyCLIToken(t, stdout, secret, "")
	if hdr != `{"alg":"HS256","typ":"JWT"}` || c.Sub != "alice" || c.Caps != nil || c.Ack != nil || c.Audience != nil ||
		c.ExpiresAt.Sub(c.IssuedAt) != token.DefaultTTL {
		t.Errorf("header %s claims %+v", hdr, c)
	}
}

func TestTokenMintSecretSources(t *testing.T) {
	secret := []byte("ash-side-secret-0123456789abcdef!")

	// Falls back to Ash's variable, read as Ash reads it (base64url here).
	unsetenv(t, "CAPGATE_TOKEN_SECRET")
	t.Setenv("ASH_CONTEXT_TOKEN_SECRET", token.EncodeSecret(secret))
	stdout, stderr, code := mintCLI(t, "--sub", "bob")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	verifyCLIToken(t, stdout, secret, "")

	// --secret-env names another variable, and then only that one counts.
	t.Setenv("MY_TOKEN_KEY", "raw text secret")
	stdout, stderr, code = mintCLI(t, "--sub", "bob", "--secret-env", "MY_TOKEN_KEY")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	verifyCLIToken(t, stdout, []byte("raw text secret"), "")
	_, stderr, code = mintCLI(t, "--sub", "bob", "--secret-env", "NO_SUCH_VAR_FOR_CAPGATE")
	if code != 2 || !strings.Contains(stderr, "no token secret: NO_SUCH_VAR_FOR_CAPGATE is unset or blank") {
		t.Errorf("unset --secret-env: exit %d, stderr %q", code, stderr)
	}

	// Neither variable: a usage error naming both.
	unsetenv(t, "ASH_CONTEXT_TOKEN_SECRET")
	stdout, stderr, code = mintCLI(t, "--sub", "bob")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "CAPGATE_TOKEN_SECRET") || !strings.Contains(stderr, "ASH_CONTEXT_TOKEN_SECRET") ||
		!strings.Contains(stderr, "--config") || !strings.Contains(stderr, "development key") {
		t.Errorf("no secret: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestTokenMintUsage(t *testing.T) {
	secret := "0123456789abcdef0123456789abcdef"
	t.Setenv("CAPGATE_TOKEN_SECRET", secret)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no sub", nil, "--sub is required"},
		{"blank sub", []string{"--sub", "  "}, "--sub is required and must not be blank"},
		{"zero ttl", []string{"--sub", "a", "--ttl", "0s"}, "--ttl 0s: must be positive"},
		{"bad ttl", []string{"--sub", "a", "--ttl", "soon"}, "invalid argument"},
		{"blank cap", []string{"--sub", "a", "--caps", ""}, "--caps: a capability pattern is blank"},
		{"argument", []string{"--sub", "a", "extra"}, "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := mintCLI(t, tc.args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
			if strings.Contains(stderr, secret) {
				t.Errorf("stderr shows the secret: %q", stderr)
			}
		})
	}
}
