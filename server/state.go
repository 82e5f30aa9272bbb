package server

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/tool"
)

// A 2026-07-28 requestState is self-contained: what a replica needs to go
// on with the call, sealed (AES-256-GCM under a key derived from the
// shared secret) so that the client can neither read nor change it. It
// names the subject it belongs to, an expiry, and the replica that holds
// the call's parked job. A use_skill run carries its conversation so far,
// so any replica can go on with it; a parked upstream call cannot move, so
// another replica forwards its continuation to the holder (internal.go).
// Each state is claimed once (Options.ClaimOnce, in the store the
// replicas share) before it is acted on: a replayed state is refused.
type requestState struct {
	ID      string       `json:"id"`  // the job's id
	Use     string       `json:"use"` // random, this state's own: the key it is claimed under
	Sub     string       `json:"sub"`
	Exp     int64        `json:"exp"`           // unix milliseconds
	Replica string       `json:"replica"`       // the replica that holds the job
	URL     string       `json:"url,omitempty"` // that replica's internal URL, "" for none
	Skill   *skillState  `json:"skill,omitempty"`
	Prompt  *promptState `json:"prompt,omitempty"`
}

// promptState is a prompts/get whose upstream asked for input: the
// prompt's directive id and the upstream's own requestState, which the
// client carries sealed and never reads.
type promptState struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// skillState is a use_skill run waiting for the client's model: enough to
// go on with it from the model's answer on any replica.
type skillState struct {
	Name    string            `json:"name"`
	Message string            `json:"message"`
	Context string            `json:"context,omitempty"`
	Tools   bool              `json:"tools,omitempty"` // tools were offered to the model
	Began   int64             `json:"began"`           // unix milliseconds, when the run began
	Key     string            `json:"key"`             // the input key of the sampling request
	At      skills.Checkpoint `json:"at"`
}

const (
	stateLabel  = "capgate request state v1"
	statePrefix = "cgrs1."
)

// ClaimFunc records key as used until expires. It reports false when key
// was already claimed (by any replica sharing the store), and an error
// when it cannot tell.
type ClaimFunc func(ctx context.Context, key string, expires time.Time) (bool, error)

// stateSealer seals and opens the request states of one replica.
type stateSealer struct {
	aead    cipher.AEAD
	replica string // this replica's id
	url     string // its internal URL
	claim   ClaimFunc
}

func newStateSealer(secret []byte, replica, url string, claim ClaimFunc) *stateSealer {
	aead := sealKey(secret, stateLabel)
	if claim == nil {
		claim = (&localClaims{}).claim
	}
	return &stateSealer{aead: aead, replica: replica, url: url, claim: claim}
}

// seal is st sealed, as the client carries it.
func (s *stateSealer) seal(st *requestState) (string, error) {
	var use [16]byte
	rand.Read(use[:])
	st.Use = hex.EncodeToString(use[:])
	plain, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("requestState: %w", err)
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	rand.Read(nonce)
	return statePrefix + base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(stateLabel))), nil
}

// Errors of open, each a coded refusal the client can act on.
var (
	errStateInvalid = tool.Errorf(tool.CodeInvalidInput, "requestState is not one capgate sealed (changed, or sealed under another secret); call the tool again without it")
	errStateExpired = tool.Errorf(tool.CodeInvalidInput, "requestState is unknown or expired; call the tool again without it")
	errStateUsed    = tool.Errorf(tool.CodeInvalidInput, "requestState was already used; call the tool again without it")
)

// open unseals raw for the caller sub. Another subject's state reads like
// an expired one, so it tells nothing of that subject's calls.
func (s *stateSealer) open(raw, sub string, now time.Time) (*requestState, error) {
	b64, ok := strings.CutPrefix(raw, statePrefix)
	if !ok {
		return nil, errStateInvalid
	}
	sealed, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(sealed) < s.aead.NonceSize() {
		return nil, errStateInvalid
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(stateLabel))
	if err != nil {
		return nil, errStateInvalid
	}
	var st requestState
	if err := json.Unmarshal(plain, &st); err != nil || st.ID == "" || st.Use == "" {
		return nil, errStateInvalid
	}
	if st.Sub != sub || now.UnixMilli() >= st.Exp {
		return nil, errStateExpired
	}
	return &st, nil
}

// use claims st once: a second use, here or on another replica, is
// refused; a store that cannot say fails closed.
func (s *stateSealer) use(ctx context.Context, st *requestState) error {
	fresh, err := s.claim(ctx, claimKey(st.Use), time.UnixMilli(st.Exp).Add(claimGrace))
	if err != nil {
		return tool.Wrap(err, tool.CodeBackendUnavailable, "requestState cannot be checked against replay: %v", err)
	}
	if !fresh {
		return errStateUsed
	}
	return nil
}

// claimGrace keeps a claim past its state's expiry, so that the replica
// whose job the state named can still tell, when it gives the job up at
// that expiry, that the state was used elsewhere (jobs.abandon).
const claimGrace = time.Minute

// claimKey is the store key a state's one use is claimed under.
func claimKey(use string) string { return "requestState:" + use }

// localClaims are the claims of a server given no store: they hold for
// this process only.
type localClaims struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (l *localClaims) claim(_ context.Context, key string, expires time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for k, exp := range l.m {
		if !now.Before(exp) {
			delete(l.m, k)
		}
	}
	if _, used := l.m[key]; used {
		return false, nil
	}
	if l.m == nil {
		l.m = map[string]time.Time{}
	}
	l.m[key] = expires
	return true, nil
}
