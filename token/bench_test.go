package token

import (
	"testing"
	"time"
)

func BenchmarkVerifyHS256(b *testing.B) {
	tok, err := Mint(testSecret, Claims{
		Sub: "telegram:123456789", ChatID: "-1001234567890", ChatType: "supergroup", Provider: "telegram",
		SessionKey: "telegram:-1001234567890:77", ThreadID: "77", MessageID: "4242",
		Caps: []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"}, Ack: []string{"elevated"},
	}, MintOptions{Ash: true, Now: fixedNow, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
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
