package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCredentialsPerSub(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	put := func(sub, acct, material string) {
		t.Helper()
		if err := s.PutCredential(ctx, sub, "bridge:gog:email", acct, []byte(material)); err != nil {
			t.Fatal(err)
		}
	}
	put("alice", "work", "alice-work")
	put("alice", "home", "alice-home")
	put("bob", "work", "bob-work")
	put("bob", "other", "bob-other")

	for _, tc := range []struct{ sub, acct, want string }{
		{"alice", "work", "alice-work"}, {"alice", "home", "alice-home"},
		{"bob", "work", "bob-work"}, {"bob", "other", "bob-other"},
	} {
		got, err := s.Credential(ctx, tc.sub, "bridge:gog:email", tc.acct)
		if err != nil || string(got) != tc.want {
			t.Errorf("Credential(%s, %s) = %q, %v; want %q", tc.sub, tc.acct, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ sub, acct string }{{"alice", "other"}, {"bob", "home"}, {"carol", "work"}} {
		if got, err := s.Credential(ctx, tc.sub, "bridge:gog:email", tc.acct); !errors.Is(err, ErrNotFound) {
			t.Errorf("Credential(%s, %s) = %q, %v; want ErrNotFound", tc.sub, tc.acct, got, err)
		}
	}
	if _, err := s.Credential(ctx, "alice", "bridge:gog:calendar", "work"); !errors.Is(err, ErrNotFound) {
		t.Errorf("another capability: %v", err)
	}

	for sub, want := range map[string][]string{"alice": {"home", "work"}, "bob": {"other", "work"}, "carol": nil} {
		got, err := s.Accounts(ctx, sub, "bridge:gog:email")
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Accounts(%s) = %q, %v; want %q", sub, got, err, want)
		}
	}

	// Upsert replaces; delete removes one row only.
	put("alice", "work", "alice-work-2")
	if got, _ := s.Credential(ctx, "alice", "bridge:gog:email", "work"); string(got) != "alice-work-2" {
		t.Errorf("after replacing: %q", got)
	}
	if err := s.DeleteCredential(ctx, "alice", "bridge:gog:email", "work"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credential(ctx, "alice", "bridge:gog:email", "work"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	if got, _ := s.Credential(ctx, "bob", "bridge:gog:email", "work"); string(got) != "bob-work" {
		t.Errorf("deleting alice's took bob's: %q", got)
	}
	if err := s.DeleteCredential(ctx, "alice", "bridge:gog:email", "work"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if err := s.PutCredential(ctx, "", "cap", "", []byte("x")); err == nil {
		t.Error("credential with an empty sub stored")
	}
}

// TestVaultHoldsNoPlaintext reads the raw bytes of every database file,
// WAL included, for the material.
func TestVaultHoldsNoPlaintext(t *testing.T) {
	t.Parallel()
	sqliteOnly(t) // reads the files; the sealing is the same on PostgreSQL
	ctx := context.Background()
	dir := t.TempDir()
	s := mustOpen(t, dir, nil)
	material := []byte("ya29.PLAINTEXT-MARKER-a8f3c9e1-refresh-token-do-not-store-in-clear")
	sub := "sub-marker-7c1e9b"
	for i := range 50 { // enough rows for the WAL to hold several pages
		if err := s.PutCredential(ctx, sub, "bridge:gog:email", "acct"+string(rune('a'+i%26))+string(rune('a'+i/26)), material); err != nil {
			t.Fatal(err)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.db*"))
	if err != nil {
		t.Fatal(err)
	}
	var seenWAL, seenSub bool
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, material) {
			t.Errorf("%s holds the material in the clear", filepath.Base(f))
		}
		if filepath.Base(f) == VaultFile+"-wal" && len(data) > 0 {
			seenWAL = true
		}
		// The key columns are stored in the clear; finding them shows
		// the search reads the right bytes.
		if bytes.Contains(data, []byte(sub)) {
			seenSub = true
		}
	}
	if !seenWAL || !seenSub {
		t.Errorf("searched %v: vault WAL seen %v, sub seen %v; the search did not look where the rows are", files, seenWAL, seenSub)
	}
	if got, err := s.Credential(ctx, sub, "bridge:gog:email", "acctaa"); err != nil || !bytes.Equal(got, material) {
		t.Errorf("read back %q, %v", got, err)
	}
}

// TestMovedCiphertextFails copies a row's sealed material to other rows:
// it must not open there.
func TestMovedCiphertextFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	for _, k := range [][2]string{{"alice", "work"}, {"bob", "work"}, {"alice", "home"}} {
		if err := s.PutCredential(ctx, k[0], "cap", k[1], []byte(k[0]+"-"+k[1])); err != nil {
			t.Fatal(err)
		}
	}
	for _, to := range [][2]string{{"bob", "work"}, {"alice", "home"}} {
		_, err := s.vault.Exec(`UPDATE credentials SET
			nonce = (SELECT nonce FROM credentials WHERE sub = 'alice' AND account_ref = 'work'),
			ciphertext = (SELECT ciphertext FROM credentials WHERE sub = 'alice' AND account_ref = 'work')
			WHERE sub = ? AND account_ref = ?`, to[0], to[1])
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Credential(ctx, to[0], "cap", to[1])
		if err == nil || errors.Is(err, ErrNotFound) || got != nil {
			t.Errorf("alice's work ciphertext in row %v: %q, %v; want an error and no data", to, got, err)
		}
	}
	if got, err := s.Credential(ctx, "alice", "cap", "work"); err != nil || string(got) != "alice-work" {
		t.Errorf("the original row: %q, %v", got, err)
	}
}

func TestCredentialAD(t *testing.T) {
	t.Parallel()
	// Field boundaries are part of the additional data.
	a := credentialAD("ab", "c", "")
	b := credentialAD("a", "bc", "")
	if bytes.Equal(a, b) {
		t.Error("(ab, c) and (a, bc) share additional data")
	}
}
