package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// KeyEnv names the environment variable that holds the vault key.
const KeyEnv = "CAPGATE_STORE_KEY"

// keySize is AES-256's key length.
const keySize = 32

// loadKey finds the vault key: opts.Key, else $CAPGATE_STORE_KEY, else
// <dir>/store.key (created on first run). It also says where the key came
// from, for messages. No error shows key material.
func loadKey(dir string, opts Options) (key []byte, from string, err error) {
	if opts.Key != nil {
		if len(opts.Key) != keySize {
			return nil, "", fmt.Errorf("store: Options.Key has %d bytes; want %d", len(opts.Key), keySize)
		}
		return opts.Key, "Options.Key", nil
	}
	if v, ok := opts.LookupEnv(KeyEnv); ok {
		key, err := parseKeyEnv(v)
		return key, KeyEnv, err
	}
	path := filepath.Join(dir, KeyFile)
	key, err = keyFile(path)
	return key, path, err
}

// parseKeyEnv reads $CAPGATE_STORE_KEY: 64 hex characters, or the base64
// or base64url (padded or not) of 32 bytes.
func parseKeyEnv(v string) ([]byte, error) {
	v = strings.TrimSpace(v)
	if len(v) == 2*keySize {
		if k, err := hex.DecodeString(v); err == nil {
			return k, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(v); err == nil && len(k) == keySize {
			return k, nil
		}
	}
	what := fmt.Sprintf("a value of %d characters that is neither", len(v))
	if v == "" {
		what = "an empty value"
	}
	return nil, fmt.Errorf("store: %s: want 64 hex characters or the base64 (or base64url) of 32 bytes, got %s "+
		"(openssl rand -hex 32 makes one; unset it to use %s in the data directory)", KeyEnv, what, KeyFile)
}

// keyFile reads the key file at path, creating it (mode 0600, 32 random
// bytes in hex) when missing. A key file that group or others may access
// is refused.
func keyFile(path string) ([]byte, error) {
	data, err := readKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createKeyFile(path); err != nil {
			return nil, err
		}
		data, err = readKeyFile(path)
	}
	if err != nil {
		return nil, err
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(k) != keySize {
		return nil, fmt.Errorf("store: %s: want 64 hex characters (a 32-byte key) and a newline", path)
	}
	return k, nil
}

func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("store: key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("store: key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("store: %s is not a regular file", path)
	}
	// Windows has no such mode bits; its ACLs are the user's business.
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" {
		return nil, fmt.Errorf("store: %s has mode %04o: group or others may read it; run chmod 600 %s", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, fmt.Errorf("store: key file: %w", err)
	}
	return data, nil
}

// createKeyFile writes a new random key to path without ever replacing an
// existing one: the key goes to a temporary file that is then linked into
// place, so a concurrent first run sees either no key file or a whole one,
// and exactly one of two racing processes' keys wins.
func createKeyFile(path string) error {
	var k [keySize]byte
	if _, err := rand.Read(k[:]); err != nil {
		return fmt.Errorf("store: new key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".store.key-*")
	if err != nil {
		return fmt.Errorf("store: new key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600; say so in case that ever changes.
	if err := tmp.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		tmp.Close()
		return fmt.Errorf("store: new key file: %w", err)
	}
	_, err = tmp.WriteString(hex.EncodeToString(k[:]) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store: new key file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("store: new key file: %w", err)
	}
	return nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("store: key: %w", err)
	}
	return cipher.NewGCM(block) // 12-byte nonces, 16-byte tags
}
