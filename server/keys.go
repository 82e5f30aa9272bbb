package server

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
)

// deriveKey is the 32-byte key for label under secret (HKDF-SHA256, no
// salt: the secret is already a key, and the label separates the uses).
// Every replica given the same secret derives the same keys, which is what
// makes sessions and request states portable between them.
func deriveKey(secret []byte, label string) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, label, 32)
	if err != nil {
		panic("server: hkdf: " + err.Error()) // only for a length over 255*32
	}
	return k
}

// randomSecret is a secret of this process's own, for a server given none.
func randomSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand panics otherwise)
	return b
}
