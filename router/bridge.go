package router

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// bridgeTokenTTL bounds a per-call bridge token: it is used at once.
const bridgeTokenTTL = 5 * time.Minute

// bridgeToken signs the short-lived Ash context token the provider of
// namespace verifies: the caller's verified claims, nothing the caller
// said, narrowed as the caller is. It is signed with the provider's own
// derived key and carries the provider's audience, so replayed at any
// front door of capgate it is refused; and its caps and ack are the
// caller's effective ones (token caps, skill scope), so replayed at
// another provider's door it could do no more than the caller.
func (r *Router) bridgeToken(c *Caller, namespace string) (string, error) {
	if len(r.opts.Secret) == 0 {
		return "", nil
	}
	key, err := r.bridge.key(r.opts.Secret, namespace)
	if err != nil {
		return "", fmt.Errorf("deriving the bridge key of %s: %w", namespace, err)
	}
	cl := token.Claims{Sub: c.Sub, Audience: []string{token.BridgeAudience(namespace)},
		Caps: r.bridgeCaps(c, namespace), Ack: append([]string{}, c.acks...)}
	if k := c.Claims; k != nil {
		cl.ChatID, cl.ChatType, cl.ChatTitle, cl.Provider, cl.SessionKey = k.ChatID, k.ChatType, k.ChatTitle, k.Provider, k.SessionKey
		cl.ThreadID, cl.SourceUsername, cl.SourceDisplayName, cl.MessageID, cl.Timezone = k.ThreadID, k.SourceUsername, k.SourceDisplayName, k.MessageID, k.Timezone
	}
	s, err := token.Mint(key, cl, token.MintOptions{Ash: true, TTL: bridgeTokenTTL, Now: r.opts.Now})
	if err != nil {
		return "", fmt.Errorf("minting the bridge context token: %w", err)
	}
	return s, nil
}

// bridgeCaps are the capability strings of the namespace's operations the
// caller may execute, as it stands (skill scope and token caps applied):
// a caller's grants are layers of patterns whose intersection no flat
// list of patterns can state, but the literal strings they allow can.
func (r *Router) bridgeCaps(c *Caller, namespace string) []string {
	caps := []string{}
	for _, d := range r.opts.Registry.Snapshot().Tools {
		if d.Kind != tool.KindBridge || d.Source != namespace {
			continue
		}
		if ex := r.toolCaps.get(d.ID).execute; c.grants.Allows(ex) {
			caps = append(caps, ex)
		}
	}
	slices.Sort(caps)
	return slices.Compact(caps)
}

// bridgeKeys caches each namespace's derived key.
type bridgeKeys struct{ m sync.Map } // namespace → []byte

func (b *bridgeKeys) key(master []byte, namespace string) ([]byte, error) {
	if k, ok := b.m.Load(namespace); ok {
		return k.([]byte), nil
	}
	k, err := token.BridgeKey(master, namespace)
	if err != nil {
		return nil, err
	}
	b.m.Store(namespace, k)
	return k, nil
}
