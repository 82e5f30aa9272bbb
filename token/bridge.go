package token

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"strings"
)

// BridgeAudiencePrefix starts the audience of every per-call token capgate
// signs for a bridge provider. No capgate front door accepts such a token:
// it is for the provider alone.
const BridgeAudiencePrefix = "capgate-bridge:"

// BridgeAudience is the audience of the per-call tokens of the provider
// serving namespace.
func BridgeAudience(namespace string) string { return BridgeAudiencePrefix + namespace }

// bridgeKeyInfo names the purpose of a derived key; the namespace follows.
const bridgeKeyInfo = "capgate/v1 bridge context-token key for namespace "

// BridgeKey derives the HS256 key of one bridge provider from capgate's
// master key: HKDF-SHA256 with an info string naming the purpose and the
// namespace. A provider gets only its own key, with which it can neither
// recover the master key nor sign a token another provider, or capgate's
// front door, accepts.
func BridgeKey(master []byte, namespace string) ([]byte, error) {
	if len(master) == 0 {
		return nil, errors.New("token: bridge key: no master key")
	}
	if strings.TrimSpace(namespace) == "" {
		return nil, errors.New("token: bridge key: namespace is blank")
	}
	return hkdf.Key(sha256.New, master, nil, bridgeKeyInfo+namespace, 32)
}
