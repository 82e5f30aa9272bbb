package token

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"testing"
)

func TestParseSecret(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []byte
	}{
		{"", nil},
		{" \n\t", nil},
		{"00ff10", []byte{0x00, 0xff, 0x10}},
		{"  DEADbeef\n", []byte{0xde, 0xad, 0xbe, 0xef}},
		{"abc", []byte{0x69, 0xb7}},                             // odd length: not hex; base64url
		{"_-8", []byte{0xff, 0xef}},                             // base64url alphabet
		{"_-8=", []byte{0xff, 0xef}},                            // with padding
		{"aGVsbG8gd29ybGQ", []byte("hello world")},              // no padding
		{"aGVsbG8gd29ybGQ=", []byte("hello world")},             // padding
		{"aGVsbG8gd29ybGQ==", []byte("aGVsbG8gd29ybGQ==")},      // wrong padding: raw
		{"a+b/c", []byte("a+b/c")},                              // standard base64 characters: raw
		{"abcde", []byte("abcde")},                              // impossible base64 length: raw
		{"pass word!", []byte("pass word!")},                    // raw
		{"  sécret ünïcode  ", []byte("sécret ünïcode")},        // raw UTF-8, trimmed
		{"0123456789abcdeg", unhex("d35db7e39ebbf3d69b71d7a0")}, // not hex: base64url (Python's urlsafe_b64decode)
	} {
		if got := ParseSecret(tc.in); !bytes.Equal(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("ParseSecret(%q) = %x, want %x", tc.in, got, tc.want)
		}
	}
}

func unhex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestEncodeSecretRoundTrip(t *testing.T) {
	if got := EncodeSecret([]byte("hello world")); got != "aGVsbG8gd29ybGQ" {
		t.Errorf("EncodeSecret = %q, want base64url without padding", got)
	}
	// Three bytes whose base64url reads as hex: written as hex instead.
	amb := []byte{0xd3, 0x4d, 0x34}
	if got := EncodeSecret(amb); got != "d34d34" || !bytes.Equal(ParseSecret(got), amb) {
		t.Errorf("EncodeSecret(%x) = %q", amb, got)
	}
	for n := 1; n <= 64; n++ {
		for range 20 {
			b := make([]byte, n)
			rand.Read(b)
			if got := ParseSecret(EncodeSecret(b)); !bytes.Equal(got, b) {
				t.Fatalf("round trip of %x through %q gave %x", b, EncodeSecret(b), got)
			}
		}
	}
}
