package server

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

func TestSessionIDsBindTheSubject(t *testing.T) {
	ids, other := newSessionIDs([]byte("secret one")), newSessionIDs([]byte("secret two"))
	a, a2 := ids.mint("alice"), ids.mint("alice")
	if a == a2 {
		t.Fatalf("two sessions share the id %q", a)
	}
	if !ids.owns(a, "alice") || !ids.owns(a2, "alice") {
		t.Fatalf("alice does not own her ids %q %q", a, a2)
	}
	// Another replica given the same secret accepts them.
	if twin := newSessionIDs([]byte("secret one")); !twin.owns(a, "alice") {
		t.Fatalf("a replica with the same secret refuses %q", a)
	}
	refused := map[string]string{
		"another subject":           ids.mint("bob"),
		"another secret":            other.mint("alice"),
		"a subject that extends it": ids.mint("alic"),
		"truncated":                 a[:len(a)-2],
		"extended":                  a + "00",
		"not hex":                   a[:len(a)-1] + "g",
		"no prefix":                 "xx" + a[2:],
		"empty":                     "",
		"another prefix":            strings.ToUpper(a[:3]) + a[3:],
	}
	for name, id := range refused {
		if ids.owns(id, "alice") {
			t.Errorf("%s: alice owns %q", name, id)
		}
	}
	// Every single-character change of the MAC is refused.
	for i := len(a) - 2*sessionMAC; i < len(a); i++ {
		c := byte('0')
		if a[i] == '0' {
			c = '1'
		}
		if ids.owns(a[:i]+string(c)+a[i+1:], "alice") {
			t.Fatalf("changing byte %d of %q is not noticed", i, a)
		}
	}
}

func TestSessionManagerWithoutCallerRefuses(t *testing.T) {
	ids := newSessionIDs(randomSecret())
	m := ids.ResolveSessionIdManager(nil)
	if _, err := m.Validate(ids.mint("")); err == nil {
		t.Fatal("a session id is valid for no caller")
	}
	if _, err := m.Terminate(ids.mint("")); err == nil {
		t.Fatal("a session can be ended by no caller")
	}
}

// BenchmarkSessionOwns is the check every 2025-11-25 request with a session
// id pays.
func BenchmarkSessionOwns(b *testing.B) {
	ids := newSessionIDs(randomSecret())
	id := ids.mint("alice")
	b.ReportAllocs()
	for b.Loop() {
		if !ids.owns(id, "alice") {
			b.Fatal("not owned")
		}
	}
}

// TestSessionMACFromClone: the MAC made from a clone of the keyed HMAC
// is HMAC-SHA256 under the key, each call afresh (no state carried over).
func TestSessionMACFromClone(t *testing.T) {
	ids := newSessionIDs(randomSecret())
	for i := range 50 {
		nonce := make([]byte, sessionNonce)
		rand.Read(nonce)
		sub := strings.Repeat("s", i*7)
		h := hmac.New(sha256.New, ids.key[:])
		h.Write(nonce)
		h.Write([]byte(sub))
		if want, got := h.Sum(nil)[:sessionMAC], ids.mac(nonce, sub); !bytes.Equal(got, want) {
			t.Fatalf("sub of %d bytes: mac %x, want %x", len(sub), got, want)
		}
	}
}

// ownsSession answers as the MAC does, for a live session whose owner it
// remembered as for any other id: its owner yes, another subject and a
// changed id no.
func TestOwnsSessionRemembered(t *testing.T) {
	s, url := serveSetup(t, setup{})
	m := s.MCP
	id := testkit.OpenSession(t, url, mint(t, token.Claims{Sub: "alice"}), "{}")
	ls := m.live.get(id)
	if ls == nil {
		t.Fatal("the session is not live")
	}
	forged := id[:len(id)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", id[len(id)-1])+1)%16])
	bobs := m.sessions.mint("bob")
	for _, c := range []struct {
		id, sub string
		want    bool
	}{{id, "alice", true}, {id, "bob", false}, {id, "alice", true}, {forged, "alice", false},
		{bobs, "bob", true}, {bobs, "alice", false}} {
		if got, mac := m.ownsSession(c.id, c.sub), m.sessions.owns(c.id, c.sub); got != c.want || got != mac {
			t.Errorf("ownsSession(%q, %s) = %v, the MAC says %v, want %v", c.id, c.sub, got, mac, c.want)
		}
	}
	if o := ls.owner.Load(); o == nil || *o != "alice" {
		t.Errorf("remembered owner %v, want alice (another subject tried too)", o)
	}
}

// BenchmarkOwnsSession is the session check of a 2025-11-25 request, A/B:
// "remembered" is ownsSession on a live session, "mac" the MAC alone.
func BenchmarkOwnsSession(b *testing.B) {
	s, url := serveSetup(b, setup{})
	id := testkit.OpenSession(b, url, mint(b, token.Claims{Sub: "alice"}), "{}")
	for _, c := range []struct {
		name string
		owns func(id, sub string) bool
	}{{"remembered", s.MCP.ownsSession}, {"mac", s.MCP.sessions.owns}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !c.owns(id, "alice") {
					b.Fatal("not owned")
				}
			}
		})
	}
}
