package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"net/http"

	mcpserver "github.com/mark3labs/mcp-go/server"
)

// sessionIDs mints the Mcp-Session-Id of protocol 2025-11-25 sessions, each
// bound to the subject that opened it: an id is random bytes and a MAC of
// them and the subject, under a key derived from the secret every replica
// shares (Options.Secret). The ids need no table of their own (the
// sessions mcp-go holds are bounded: expire.go), and every replica, or the
// same one after a restart,
// accepts the id: mcp-go v1.2.1 serves a non-initialize POST whose id
// Validate accepts but that it never registered with a fresh session of
// its own, initialized, that knows nothing the client said at initialize
// (capabilities, log level). An id is worth nothing to another subject or
// under another secret: both get 404, on which a client opens a new
// session.
//
// Protocol 2026-07-28 has no sessions; mcp-go ignores the header there.
type sessionIDs struct {
	key [32]byte
	// keyed is HMAC-SHA256 under key with nothing written: each MAC
	// starts from a clone of it, which skips hashing the key's inner pad
	// and half of hmac.New's allocations on every 2025-11-25 request.
	keyed hash.Hash
}

const (
	sessionPrefix = "cg-"
	sessionNonce  = 16 // random bytes
	sessionMAC    = 16 // bytes of HMAC-SHA256 kept
)

var errSessionNotFound = errors.New("no such session for this subject")

// sessionLabel separates the session MAC key from every other key derived
// from the same secret.
const sessionLabel = "capgate session id v1"

// newSessionIDs keys session ids from secret (HKDF-SHA256, sessionLabel).
func newSessionIDs(secret []byte) *sessionIDs {
	s := &sessionIDs{}
	copy(s.key[:], deriveKey(secret, sessionLabel))
	s.keyed = hmac.New(sha256.New, s.key[:])
	return s
}

// mint returns a new session id for sub.
func (s *sessionIDs) mint(sub string) string {
	var nonce [sessionNonce]byte
	rand.Read(nonce[:])
	b := make([]byte, 0, len(sessionPrefix)+2*(sessionNonce+sessionMAC))
	b = append(b, sessionPrefix...)
	b = hex.AppendEncode(b, nonce[:])
	return string(hex.AppendEncode(b, s.mac(nonce[:], sub)))
}

// owns says whether id was minted, by this process, for sub.
func (s *sessionIDs) owns(id, sub string) bool {
	if len(id) != len(sessionPrefix)+2*(sessionNonce+sessionMAC) || id[:len(sessionPrefix)] != sessionPrefix {
		return false
	}
	var raw [sessionNonce + sessionMAC]byte
	if _, err := hex.Decode(raw[:], []byte(id[len(sessionPrefix):])); err != nil {
		return false
	}
	return hmac.Equal(raw[sessionNonce:], s.mac(raw[:sessionNonce], sub))
}

// ownsSession is m.sessions.owns(id, sub), remembered on the live
// session id names: a session's requests after its first skip the MAC
// (BenchmarkOwnsSession). Only a pair the MAC passed is remembered, under
// the one key m's ids have for its whole life, so the answer is the MAC's.
func (m *MCP) ownsSession(id, sub string) bool {
	ls := m.live.get(id)
	if ls != nil {
		if o := ls.owner.Load(); o != nil && *o == sub {
			return true
		}
	}
	if !m.sessions.owns(id, sub) {
		return false
	}
	if ls != nil {
		owner := sub // escapes here only, not on every call
		ls.owner.Store(&owner)
	}
	return true
}

// mac is the first sessionMAC bytes of HMAC-SHA256(key, nonce || sub); the
// nonce has a fixed length, so the input is unambiguous.
func (s *sessionIDs) mac(nonce []byte, sub string) []byte {
	var h hash.Hash
	if c, ok := s.keyed.(hash.Cloner); ok {
		if hc, err := c.Clone(); err == nil {
			h = hc
		}
	}
	if h == nil { // a build whose HMAC cannot be cloned
		h = hmac.New(sha256.New, s.key[:])
	}
	h.Write(nonce)
	io.WriteString(h, sub)
	var sum [sha256.Size]byte
	return h.Sum(sum[:0])[:sessionMAC]
}

// ResolveSessionIdManager gives mcp-go the session ids of the request's
// caller (the router verified it before mcp-go sees the request). The
// idle-session sweeper, which capgate does not enable, would pass nil.
func (s *sessionIDs) ResolveSessionIdManager(r *http.Request) mcpserver.SessionIdManager {
	m := subjectSessions{ids: s}
	if r != nil {
		if c := CallerFrom(r.Context()); c != nil {
			m.sub, m.known = c.Sub, true
		}
	}
	return m
}

// subjectSessions is mcp-go's SessionIdManager for one subject.
type subjectSessions struct {
	ids   *sessionIDs
	sub   string
	known bool // false: no verified caller, so no id is valid
}

func (m subjectSessions) Generate() string { return m.ids.mint(m.sub) }

func (m subjectSessions) Validate(id string) (bool, error) {
	if !m.known || !m.ids.owns(id, m.sub) {
		return false, errSessionNotFound
	}
	return false, nil
}

// Terminate keeps nothing to forget: mcp-go drops the session's state on
// DELETE, and an id presented again starts afresh. (bearerAuth has already
// refused another subject's DELETE; this refuses it again.)
func (m subjectSessions) Terminate(id string) (bool, error) {
	_, err := m.Validate(id)
	return false, err
}
