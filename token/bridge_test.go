package token

import (
	"bytes"
	"testing"
)

func TestBridgeKey(t *testing.T) {
	a, err := BridgeKey(testSecret, "gog")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := BridgeKey(testSecret, "gog")
	other, _ := BridgeKey(testSecret, "gogx")
	switch {
	case len(a) != 32 || !bytes.Equal(a, again):
		t.Errorf("a bridge key is 32 bytes, the same every time: %d", len(a))
	case bytes.Equal(a, other) || bytes.Equal(a, testSecret) || bytes.Contains(a, testSecret[:8]):
		t.Error("a bridge key is its namespace's own, and not the master key")
	}
	if _, err := BridgeKey(nil, "gog"); err == nil {
		t.Error("no master key: want an error")
	}
	if _, err := BridgeKey(testSecret, " "); err == nil {
		t.Error("blank namespace: want an error")
	}
}

// TestBridgeAudienceRefused: a token with a bridge provider's audience is
// refused by a verifier of another audience, even signed with the right
// key and listing that verifier's audience too.
func TestBridgeAudienceRefused(t *testing.T) {
	v := newHS(t, func(o *Options) { o.Audience = "capgate" })
	for _, aud := range [][]string{{"capgate-bridge:gog"}, {"capgate", "capgate-bridge:gog"}} {
		raw, err := Mint(testSecret, Claims{Sub: testSub, IssuedAt: testNow, Audience: aud}, MintOptions{Ash: true})
		if err != nil {
			t.Fatal(err)
		}
		refused(t, v, raw, ReasonAudience, testSecret)
	}
	// The provider's own verifier takes it.
	pv := newHS(t, func(o *Options) { o.Audience = BridgeAudience("gog") })
	raw, _ := Mint(testSecret, Claims{Sub: testSub, IssuedAt: testNow, Audience: []string{BridgeAudience("gog")}}, MintOptions{Ash: true})
	if _, err := pv.Verify(raw); err != nil {
		t.Errorf("the provider's verifier: %v", err)
	}
}
