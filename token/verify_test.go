package token

import (
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func fullClaims() Claims {
	return Claims{
		Sub:               testSub,
		IssuedAt:          testNow.Add(-10 * time.Second),
		ExpiresAt:         testNow.Add(5 * time.Minute),
		NotBefore:         testNow.Add(-10 * time.Second),
		ID:                "0123456789abcdef0123456789abcdef",
		ChatID:            "-100123456789",
		ChatType:          "supergroup",
		ChatTitle:         `Ops "war room" <prod> & café ☕ 🚀`,
		Provider:          "telegram",
		SessionKey:        "telegram:-100123456789:42",
		ThreadID:          "42",
		SourceUsername:    "alice_ops",
		SourceDisplayName: "Alice\tO'Neil\n\\ Ops",
		MessageID:         "9001",
		Timezone:          "Europe/Berlin",
		Caps:              []string{"rye.execute.tool.mcp.filesystem.*", "rye.fetch.*"},
		Ack:               []string{"elevated"},
		Audience:          []string{"capgate", "other"},
		Issuer:            "ash",
	}
}

func TestRoundTrip(t *testing.T) {
	for _, ash := range []bool{true, false} {
		t.Run(fmt.Sprintf("ash=%v", ash), func(t *testing.T) {
			want := fullClaims()
			tok, err := Mint(testSecret, want, MintOptions{Ash: ash})
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.Split(tok, ".")
			hdr, _ := base64.RawURLEncoding.DecodeString(parts[0])
			payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
			wantHdr, ver := jwtHeader, false
			if ash {
				wantHdr, ver = ashHeader, true
			}
			if string(hdr) != wantHdr {
				t.Errorf("header %s, want %s", hdr, wantHdr)
			}
			if strings.Contains(string(payload), `"ver":1`) != ver {
				t.Errorf("payload %s: ver present %v, want %v", payload, !ver, ver)
			}
			v := newHS(t, func(o *Options) { o.Audience = "capgate" })
			got, err := v.Verify(tok)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("claims\n got %+v\nwant %+v", *got, want)
			}
		})
	}
}

func TestRoundTripMinimal(t *testing.T) {
	c := Claims{Sub: testSub}
	tok, err := Mint(testSecret, c, MintOptions{Ash: true, Now: fixedNow, TTL: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got, err := newHS(t).Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.Sub != testSub || !got.IssuedAt.Equal(testNow) || !got.ExpiresAt.Equal(testNow.Add(2*time.Minute)) {
		t.Errorf("claims %+v", got)
	}
	if len(got.ID) != 32 || strings.Trim(got.ID, "0123456789abcdef") != "" {
		t.Errorf("jti %q, want 32 hex digits", got.ID)
	}
	if got.Caps != nil || got.Ack != nil || got.Audience != nil || !got.NotBefore.IsZero() || got.ChatID != "" {
		t.Errorf("absent claims came back set: %+v", got)
	}

	// Empty caps are present (and grant nothing), unlike absent ones.
	c.Caps, c.Ack = []string{}, []string{}
	tok, err = Mint(testSecret, c, MintOptions{Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	got, err = newHS(t).Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.Caps == nil || len(got.Caps) != 0 || got.Ack == nil || len(got.Ack) != 0 {
		t.Errorf("empty caps/ack: %#v %#v", got.Caps, got.Ack)
	}
	if !got.ExpiresAt.Equal(testNow.Add(DefaultTTL)) {
		t.Errorf("exp %v, want now+%v", got.ExpiresAt, DefaultTTL)
	}
}

func TestVerifyStandardJWTShapes(t *testing.T) {
	v := newHS(t, func(o *Options) { o.Audience = "capgate" })
	iat, exp := testNow.Unix(), testNow.Add(time.Minute).Unix()
	for _, tc := range []struct{ name, header, payload string }{
		{"no typ", `{"alg":"HS256"}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat, exp)},
		{"lower-case typ", `{"typ":"jwt","alg":"HS256"}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat, exp)},
		{"ash typ any case", `{"alg":"HS256","typ":"ash_context","ver":1}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d,"ver":1}`, testSub, iat, exp)},
		{"RFC 9068 at+jwt", `{"alg":"HS256","typ":"at+jwt"}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d,"aud":"capgate"}`, testSub, iat, exp)},
		{"RFC 9068 media type", `{"alg":"HS256","typ":"application/AT+JWT"}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat, exp)},
		{"ash typ without ver", `{"alg":"HS256","typ":"ASH_CONTEXT"}`, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat, exp)},
		{"fractional dates, spaces, aud string", `{ "alg" : "HS256" , "typ" : "JWT" }`,
			fmt.Sprintf(`{ "sub" : %q , "iat" : %d.25 , "exp" : %d.5, "aud" : "capgate", "extra": {"a":[1,{"b":"]}"}]}, "jti": null }`, testSub, iat, exp)},
		{"escaped keys and values", `{"\u0061lg":"HS\u0032\u0035\u0036"}`,
			fmt.Sprintf(`{"s\u0075b":"subject-7f3a\u0039c","iat":%d,"exp":%d,"chat_title":"caf\u00e9 \ud83d\ude80"}`, iat, exp)},
		{"unused claims of any type", `{"alg":"HS256"}`,
			fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d,"scope":["a"],"admin":true,"n":null}`, testSub, iat, exp)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(signHS256(testSecret, tc.header, tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if c.Sub != testSub || c.IssuedAt.Unix() != iat || c.ExpiresAt.Unix() != exp {
				t.Errorf("claims %+v", c)
			}
		})
	}
	c, err := v.Verify(signHS256(testSecret, `{"alg":"HS256"}`,
		fmt.Sprintf(`{"sub":%q,"iat":%d.25,"exp":%d,"chat_title":"caf\u00e9 \ud83d\ude80","aud":"capgate"}`, testSub, iat, exp)))
	if err != nil {
		t.Fatal(err)
	}
	if c.ChatTitle != "café 🚀" || !c.IssuedAt.Equal(testNow.Add(250*time.Millisecond)) || !reflect.DeepEqual(c.Audience, []string{"capgate"}) {
		t.Errorf("decoded %q %v %v", c.ChatTitle, c.IssuedAt, c.Audience)
	}
}

func TestRefusals(t *testing.T) {
	iat, exp := testNow.Unix(), testNow.Add(time.Minute).Unix()
	good := func(extra string) string {
		return fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d%s}`, testSub, iat, exp, extra)
	}
	ashHdr := ashHeader
	valid := signHS256(testSecret, ashHdr, good(""))
	other := signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":"root","iat":%d,"exp":%d}`, iat, exp))
	vp := strings.Split(valid, ".")
	op := strings.Split(other, ".")
	wrongSecret := []byte("another-secret-entirely-0123456789")

	tests := []struct {
		name   string
		tok    string
		reason Reason
		detail string // a phrase the detail must contain
	}{
		{"empty", "", ReasonMissing, "no token"},
		{"blank", "  \n", ReasonMissing, "no token"},
		{"two parts", vp[0] + "." + vp[1], ReasonFormat, "three"},
		{"four parts", valid + ".x", ReasonFormat, "three"},
		{"bad base64 header", "!!!." + vp[1] + "." + vp[2], ReasonFormat, "header is not base64url"},
		{"padded payload", vp[0] + "." + vp[1] + "==." + vp[2], ReasonFormat, "payload is not base64url"},
		{"bad base64 signature", vp[0] + "." + vp[1] + ".a+b/", ReasonFormat, "signature is not base64url"},
		{"header not JSON", signHS256(testSecret, `{"alg":"HS256"`, good("")), ReasonFormat, "header is not JSON"},
		{"header an array", signHS256(testSecret, `["HS256"]`, good("")), ReasonFormat, "header is not a JSON object"},
		{"payload not JSON", signHS256(testSecret, ashHdr, `{"sub":`), ReasonFormat, "payload is not JSON"},
		{"payload an array", signHS256(testSecret, ashHdr, `[1,2]`), ReasonFormat, "payload is not a JSON object"},
		{"crit", signHS256(testSecret, `{"alg":"HS256","crit":["b64"],"b64":false}`, good("")), ReasonFormat, "crit"},
		{"kid not a string", signHS256(testSecret, `{"alg":"HS256","kid":7}`, good("")), ReasonFormat, "kid"},

		{"tampered payload", vp[0] + "." + op[1] + "." + vp[2], ReasonSignature, "HS256 signature does not verify"},
		{"tampered signature", vp[0] + "." + vp[1] + "." + op[2], ReasonSignature, "does not verify"},
		{"no signature", vp[0] + "." + vp[1] + ".", ReasonSignature, "does not verify"},
		{"wrong secret", signHS256(wrongSecret, ashHdr, good("")), ReasonSignature, "does not verify"},

		{"alg none", b64s(`{"alg":"none","typ":"JWT"}`) + "." + vp[1] + ".", ReasonAlgorithm, `"none"`},
		{"alg NONE signed", signHS256(testSecret, `{"alg":"NONE"}`, good("")), ReasonAlgorithm, `"none"`},
		{"no alg", signHS256(testSecret, `{"typ":"JWT"}`, good("")), ReasonAlgorithm, "no alg"},
		{"alg not a string", signHS256(testSecret, `{"alg":256}`, good("")), ReasonAlgorithm, "not a string"},
		{"alg unknown", signHS256(testSecret, `{"alg":"HS257"}`, good("")), ReasonAlgorithm, "unknown alg"},
		{"alg lower case", signHS256(testSecret, `{"alg":"hs256"}`, good("")), ReasonAlgorithm, "unknown alg"},
		{"HS512", signHS256(testSecret, `{"alg":"HS512"}`, good("")), ReasonAlgorithm, "HS256 only"},
		{"RS256 header with the HS secret", signHS256(testSecret, `{"alg":"RS256","typ":"JWT"}`, good("")), ReasonAlgorithm, "no JWKS is configured"},
		{"EdDSA header with the HS secret", signHS256(testSecret, `{"alg":"EdDSA"}`, good("")), ReasonAlgorithm, "no JWKS is configured"},
		{"wrong typ", signHS256(testSecret, `{"alg":"HS256","typ":"JWS"}`, good("")), ReasonAlgorithm, "typ must be JWT, at+jwt or ASH_CONTEXT"},
		{"typ at+jwt+x", signHS256(testSecret, `{"alg":"HS256","typ":"at+jwt+x"}`, good("")), ReasonAlgorithm, "typ"},
		{"typ at+jwt tampered", strings.Join([]string{b64s(`{"alg":"HS256","typ":"at+jwt"}`), vp[1], vp[2]}, "."), ReasonSignature, "does not verify"},
		{"typ not a string", signHS256(testSecret, `{"alg":"HS256","typ":1}`, good("")), ReasonAlgorithm, "typ"},
		{"ash ver 2", signHS256(testSecret, `{"alg":"HS256","typ":"ASH_CONTEXT","ver":2}`, good("")), ReasonAlgorithm, "ver must be 1"},
		{"ash ver string", signHS256(testSecret, `{"alg":"HS256","typ":"ASH_CONTEXT","ver":"1"}`, good("")), ReasonAlgorithm, "ver must be 1"},

		{"expired", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat-600, iat-120)), ReasonExpired, "token expired 2m0s ago"},
		{"iat in the future", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testSub, iat+90, iat+600)), ReasonNotYetValid, "issued 1m30s in the future"},
		{"nbf in the future", signHS256(testSecret, ashHdr, good(fmt.Sprintf(`,"nbf":%d`, iat+45))), ReasonNotYetValid, "not valid for another 45s"},

		{"no sub", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"iat":%d,"exp":%d,"chat_id":%q}`, iat, exp, testSub)), ReasonClaims, "no sub"},
		{"blank sub", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":" \t ","iat":%d,"exp":%d}`, iat, exp)), ReasonClaims, "sub claim is blank"},
		{"empty sub", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":"","iat":%d,"exp":%d}`, iat, exp)), ReasonClaims, "blank"},
		{"sub a number", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":7,"iat":%d,"exp":%d}`, iat, exp)), ReasonClaims, "sub is not a string"},
		{"sub null", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":null,"iat":%d,"exp":%d}`, iat, exp)), ReasonClaims, "sub is not a string"},
		{"no iat", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"exp":%d}`, testSub, exp)), ReasonClaims, "no iat"},
		{"no exp", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"iat":%d}`, testSub, iat)), ReasonClaims, "no exp"},
		{"exp a string", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":"%d"}`, testSub, iat, exp)), ReasonClaims, "exp is not a number"},
		{"iat absurd", signHS256(testSecret, ashHdr, fmt.Sprintf(`{"sub":%q,"iat":1e300,"exp":%d}`, testSub, exp)), ReasonClaims, "iat"},
		{"chat_id a number", signHS256(testSecret, ashHdr, good(`,"chat_id":-1001`)), ReasonClaims, "chat_id is not a string"},
		{"caps a string", signHS256(testSecret, ashHdr, good(`,"caps":"rye.*"`)), ReasonClaims, "caps is not an array of strings"},
		{"caps with a number", signHS256(testSecret, ashHdr, good(`,"caps":["rye.fetch.*",1]`)), ReasonClaims, "caps"},
		{"caps null", signHS256(testSecret, ashHdr, good(`,"caps":null`)), ReasonClaims, "caps"},
		{"caps with a blank", signHS256(testSecret, ashHdr, good(`,"caps":["rye.fetch.*"," "]`)), ReasonClaims, "caps has a blank element"},
		{"ack an object", signHS256(testSecret, ashHdr, good(`,"ack":{"elevated":true}`)), ReasonClaims, "ack"},
		{"aud a number", signHS256(testSecret, ashHdr, good(`,"aud":1`)), ReasonClaims, "aud"},
		{"a claim twice", signHS256(testSecret, ashHdr, good(`,"sub":"root"`)), ReasonFormat, "payload has a claim twice"},
		{"invalid UTF-8", signHS256(testSecret, ashHdr, good(",\"chat_title\":\"\xff\"")), ReasonClaims, "chat_title"},

		{"wrong audience", signHS256(testSecret, ashHdr, good(`,"aud":"someone-else"`)), ReasonAudience, `does not include "capgate"`},
		{"empty audience list", signHS256(testSecret, ashHdr, good(`,"aud":[]`)), ReasonAudience, "capgate"},
	}
	v := newHS(t, func(o *Options) { o.Audience = "capgate" })
	if _, err := v.Verify(valid); err != nil {
		t.Fatalf("the valid token is refused: %v", err)
	}
	seen := map[Reason]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := refused(t, v, tt.tok, tt.reason, wrongSecret)
			if !strings.Contains(e.Detail, tt.detail) {
				t.Errorf("detail %q lacks %q", e.Detail, tt.detail)
			}
			seen[tt.reason] = true
		})
	}
	for _, r := range []Reason{ReasonMissing, ReasonFormat, ReasonAlgorithm, ReasonSignature, ReasonExpired, ReasonNotYetValid, ReasonClaims, ReasonAudience} {
		if !seen[r] {
			t.Errorf("no case for reason %s", r)
		}
	}
}

func TestExpiredMessage(t *testing.T) {
	tok, err := Mint(testSecret, Claims{Sub: testSub, IssuedAt: testNow.Add(-10 * time.Minute), ExpiresAt: testNow.Add(-2 * time.Minute)}, MintOptions{Ash: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = newHS(t).Verify(tok)
	if err == nil || err.Error() != "token_invalid: expired: token expired 2m0s ago" {
		t.Errorf("error %v", err)
	}
}

func TestLeeway(t *testing.T) {
	mint := func(iat, exp time.Time, nbf time.Time) string {
		tok, err := Mint(testSecret, Claims{Sub: testSub, IssuedAt: iat, ExpiresAt: exp, NotBefore: nbf}, MintOptions{Ash: true})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	v := newHS(t)
	past := testNow.Add(-time.Hour)
	for _, tc := range []struct {
		name   string
		tok    string
		reason Reason // "" when accepted
	}{
		{"20s past exp", mint(past, testNow.Add(-20*time.Second), time.Time{}), ""},
		{"30s past exp", mint(past, testNow.Add(-30*time.Second), time.Time{}), ""},
		{"31s past exp", mint(past, testNow.Add(-31*time.Second), time.Time{}), ReasonExpired},
		{"iat 20s ahead", mint(testNow.Add(20*time.Second), testNow.Add(time.Hour), time.Time{}), ""},
		{"iat 31s ahead", mint(testNow.Add(31*time.Second), testNow.Add(time.Hour), time.Time{}), ReasonNotYetValid},
		{"nbf 20s ahead", mint(past, testNow.Add(time.Hour), testNow.Add(20*time.Second)), ""},
		{"nbf 31s ahead", mint(past, testNow.Add(time.Hour), testNow.Add(31*time.Second)), ReasonNotYetValid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.reason == "" {
				if _, err := v.Verify(tc.tok); err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			refused(t, v, tc.tok, tc.reason)
		})
	}
	strict := newHS(t, func(o *Options) { o.Leeway = time.Second })
	refused(t, strict, mint(past, testNow.Add(-20*time.Second), time.Time{}), ReasonExpired)
	if _, err := NewVerifier(Options{Secret: testSecret, Leeway: -time.Second}); err == nil {
		t.Error("negative leeway accepted")
	}
}

func TestAudience(t *testing.T) {
	mint := func(aud ...string) string {
		tok, err := Mint(testSecret, Claims{Sub: testSub, Audience: aud}, MintOptions{Now: fixedNow})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	withAud := newHS(t, func(o *Options) { o.Audience = "capgate" })
	noAud := newHS(t)
	for _, tok := range []string{mint(), mint("capgate"), mint("x", "capgate")} {
		if _, err := withAud.Verify(tok); err != nil {
			t.Errorf("refused: %v", err)
		}
	}
	refused(t, withAud, mint("x", "y"), ReasonAudience)
	refused(t, withAud, mint("CAPGATE"), ReasonAudience)
	if c, err := noAud.Verify(mint("x", "y")); err != nil || !reflect.DeepEqual(c.Audience, []string{"x", "y"}) {
		t.Errorf("without a configured audience: %v %v", c, err)
	}
}

func TestErrorMatching(t *testing.T) {
	tok, _ := Mint(testSecret, Claims{Sub: testSub, IssuedAt: testNow.Add(-time.Hour), ExpiresAt: testNow.Add(-time.Minute)}, MintOptions{})
	_, err := newHS(t).Verify(tok)
	wrapped := fmt.Errorf("router: %w", err)
	if !errors.Is(wrapped, ErrExpired) || errors.Is(wrapped, ErrSignature) || ReasonOf(wrapped) != ReasonExpired {
		t.Errorf("errors.Is/ReasonOf on %v", wrapped)
	}
	if ReasonOf(errors.New("other")) != "" || ReasonOf(nil) != "" {
		t.Error("ReasonOf of a foreign error is not empty")
	}
	if (&Error{Reason: ReasonKey}).Error() != "token_invalid: key" {
		t.Error("message without detail")
	}
}

func TestNewVerifierNeedsAKey(t *testing.T) {
	_, err := NewVerifier(Options{})
	if err == nil || !strings.Contains(err.Error(), "no verification key") {
		t.Errorf("error %v", err)
	}
	if _, err := NewVerifier(Options{Secret: []byte{}}); err == nil {
		t.Error("an empty secret counts as a key")
	}
}

func TestVerifierCopiesSecret(t *testing.T) {
	secret := append([]byte(nil), testSecret...)
	v, err := NewVerifier(Options{Secret: secret, Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := Mint(testSecret, Claims{Sub: testSub}, MintOptions{Now: fixedNow})
	secret[0] ^= 0xff
	if _, err := v.Verify(tok); err != nil {
		t.Errorf("changing the caller's slice changed the verifier: %v", err)
	}
}

func TestVerifyConcurrent(t *testing.T) {
	v := newHS(t)
	good, _ := Mint(testSecret, Claims{Sub: testSub}, MintOptions{Now: fixedNow, Ash: true})
	bad := signHS256([]byte("nope-nope-nope"), ashHeader, `{"sub":"x","iat":1,"exp":2}`)
	done := make(chan error)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 200; i++ {
				if _, err := v.Verify(good); err != nil {
					done <- err
					return
				}
				if ReasonOf(func() error { _, err := v.Verify(bad); return err }()) != ReasonSignature {
					done <- errors.New("bad token not refused for its signature")
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func TestMintRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret []byte
		c      Claims
		opts   MintOptions
		want   string
	}{
		{"no secret", nil, Claims{Sub: "a"}, MintOptions{}, "no secret"},
		{"blank sub", testSecret, Claims{Sub: " "}, MintOptions{}, "sub is blank"},
		{"negative ttl", testSecret, Claims{Sub: "a"}, MintOptions{TTL: -time.Second}, "negative"},
		{"blank cap", testSecret, Claims{Sub: "a", Caps: []string{""}}, MintOptions{}, "caps"},
		{"invalid UTF-8", testSecret, Claims{Sub: "a", ChatTitle: "\xff"}, MintOptions{}, "chat_title"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := Mint(tc.secret, tc.c, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Mint = %q, %v; want an error with %q", tok, err, tc.want)
			}
		})
	}
}

// The cache of verified tokens spares the signature check, never the
// time-bound claims, and never lets a token it did not verify through.
func TestVerifiedTokensCache(t *testing.T) {
	now := testNow
	v, err := NewVerifier(Options{Secret: testSecret, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Mint(testSecret, Claims{Sub: "alice"}, MintOptions{Now: fixedNow, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if c, err := v.Verify(tok); err != nil || c.Sub != "alice" {
			t.Fatalf("Verify = %v, %v", c, err)
		}
	}
	// The same payload under another signature is not the cached token.
	forged := tok[:strings.LastIndexByte(tok, '.')+1] + b64s(strings.Repeat("x", 32))
	refused(t, v, forged, ReasonSignature)
	// Expiry is checked at every use, cached or not.
	now = testNow.Add(time.Minute + DefaultLeeway + time.Second)
	refused(t, v, tok, ReasonExpired)
	// A refused token is refused again: refusals are not cached as passes.
	refused(t, v, forged, ReasonSignature)
	// The cache forgets the least recently used token when full, and still verifies.
	now = testNow
	for i := range maxCached + 10 {
		other, err := Mint(testSecret, Claims{Sub: "u" + strconv.Itoa(i)}, MintOptions{Now: fixedNow, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := v.Verify(other); err != nil || c.Sub != "u"+strconv.Itoa(i) {
			t.Fatalf("token %d: Verify = %v, %v", i, c, err)
		}
	}
	if n := v.verified.Len(); n > maxCached {
		t.Fatalf("%d tokens cached, more than %d", n, maxCached)
	}
}
