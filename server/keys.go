package server

import (
	"crypto/aes"
	"crypto/cipher"
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

// sealKey is AES-256-GCM under the key for label under secret.
func sealKey(secret []byte, label string) cipher.AEAD {
	block, err := aes.NewCipher(deriveKey(secret, label))
	if err != nil {
		panic("server: aes: " + err.Error()) // the key is always 32 bytes
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic("server: gcm: " + err.Error())
	}
	return aead
}

// randomSecret is a secret of this process's own, for a server given none.
func randomSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand panics otherwise)
	return b
}
