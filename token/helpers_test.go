package token

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

var (
	testSecret = []byte("capgate-test-secret-0123456789abcdef")
	testNow    = time.Unix(1_750_000_000, 0)
	testSub    = "subject-7f3a9c" // distinctive, so a leak in a message is visible
)

func fixedNow() time.Time { return testNow }

func b64s(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// signHS256 builds a token from literal header and payload JSON, signed
// with HMAC-SHA256 under key whatever the header says.
func signHS256(key []byte, header, payload string) string {
	in := b64s(header) + "." + b64s(payload)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(in))
	return in + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func newHS(t *testing.T, opts ...func(*Options)) *Verifier {
	t.Helper()
	o := Options{Secret: testSecret, Now: fixedNow}
	for _, f := range opts {
		f(&o)
	}
	v, err := NewVerifier(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// refused asserts that v refuses tok for reason, and that the message
// leaks neither the token, nor any of its segments, nor the secrets, nor
// the subject.
func refused(t *testing.T, v *Verifier, tok string, reason Reason, secrets ...[]byte) *Error {
	t.Helper()
	c, err := v.Verify(tok)
	if err == nil {
		t.Fatalf("accepted, want %s; claims %+v", reason, c)
	}
	if c != nil {
		t.Errorf("claims %+v returned with an error", c)
	}
	te, ok := err.(*Error)
	if !ok {
		t.Fatalf("error %T %v, want *token.Error", err, err)
	}
	if te.Reason != reason || ReasonOf(err) != reason {
		t.Fatalf("reason %q (%v), want %q", te.Reason, err, reason)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "token_invalid: "+string(reason)) {
		t.Errorf("message %q lacks the prefix token_invalid: %s", msg, reason)
	}
	assertNoLeak(t, msg, tok, secrets...)
	return te
}

func assertNoLeak(t *testing.T, msg, tok string, secrets ...[]byte) {
	t.Helper()
	if tok != "" && strings.Contains(msg, tok) {
		t.Errorf("message contains the token: %q", msg)
	}
	for i, seg := range strings.Split(tok, ".") {
		if len(seg) >= 8 && strings.Contains(msg, seg) {
			t.Errorf("message contains token segment %d: %q", i, msg)
		}
	}
	if strings.Contains(msg, testSub) {
		t.Errorf("message contains the subject: %q", msg)
	}
	for _, s := range append(secrets, testSecret) {
		for _, form := range []string{string(s), hex.EncodeToString(s), base64.RawURLEncoding.EncodeToString(s), base64.StdEncoding.EncodeToString(s)} {
			if len(form) >= 8 && strings.Contains(msg, form) {
				t.Errorf("message contains a secret: %q", msg)
			}
		}
	}
}
