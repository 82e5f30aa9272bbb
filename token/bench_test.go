package token

import (
	"strconv"
	"testing"
	"time"
)

func benchToken(b *testing.B, id string) string {
	tok, err := Mint(testSecret, Claims{
		Sub: "telegram:123456789", ChatID: "-1001234567890", ChatType: "supergroup", Provider: "telegram",
		SessionKey: "telegram:-1001234567890:77", ThreadID: "77", MessageID: "4242", ID: id,
		Caps: []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}, Ack: []string{"elevated"},
	}, MintOptions{Ash: true, Now: fixedNow, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	return tok
}

// BenchmarkVerifyHS256 is a token seen before: the cache's path.
func BenchmarkVerifyHS256(b *testing.B) {
	tok := benchToken(b, "")
	v, err := NewVerifier(Options{Secret: testSecret, Now: fixedNow})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyHS256Refused(b *testing.B) {
	tok := signHS256([]byte("wrong-secret-wrong-secret"), ashHeader, `{"sub":"x","iat":1,"exp":2}`)
	v, err := NewVerifier(Options{Secret: testSecret, Now: fixedNow})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok); err == nil {
			b.Fatal("accepted")
		}
	}
}

// BenchmarkVerifyHS256Uncached cycles through more tokens than the cache
// holds: the signature and claims are checked every time.
func BenchmarkVerifyHS256Uncached(b *testing.B) {
	toks := make([]string, 3*maxCached)
	for i := range toks {
		toks[i] = benchToken(b, strconv.Itoa(i))
	}
	v, err := NewVerifier(Options{Secret: testSecret, Now: fixedNow})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := v.Verify(toks[i%len(toks)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
