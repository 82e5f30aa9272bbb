package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
)

// Credentials live in vault.db, apart from operation data. The material is
// sealed with AES-256-GCM under a fresh random 12-byte nonce per write;
// the row's key columns (sub, capability, account) are the additional
// data, so a ciphertext copied or moved to another row does not open.

// credentialAD is the additional data that binds a sealed credential to
// its row. Each field is length-prefixed, so no two keys share it.
func credentialAD(sub, capabilityID, accountRef string) []byte {
	ad := make([]byte, 0, 32+len(sub)+len(capabilityID)+len(accountRef))
	ad = append(ad, "capgate credential v1\x00"...)
	for _, f := range []string{sub, capabilityID, accountRef} {
		ad = binary.AppendUvarint(ad, uint64(len(f)))
		ad = append(ad, f...)
	}
	return ad
}

func (s *Store) seal(plaintext, ad []byte) (nonce, ciphertext []byte) {
	nonce = make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic("store: crypto/rand: " + err.Error())
	}
	return nonce, s.aead.Seal(nil, nonce, plaintext, ad)
}

// checkCredentialKey refuses an empty sub or capability id. The account
// ref may be empty: the capability's only account.
func checkCredentialKey(sub, capabilityID string) error {
	switch {
	case sub == "":
		return errors.New("store: credential: empty sub")
	case capabilityID == "":
		return errors.New("store: credential: empty capability id")
	}
	return nil
}

// PutCredential stores material for (sub, capabilityID, accountRef),
// replacing what was there.
func (s *Store) PutCredential(ctx context.Context, sub, capabilityID, accountRef string, material []byte) error {
	if s.vault == nil {
		return ErrNoVault
	}
	if err := checkCredentialKey(sub, capabilityID); err != nil {
		return err
	}
	nonce, ct := s.seal(material, credentialAD(sub, capabilityID, accountRef))
	now := s.nowMS()
	_, err := s.vault.ExecContext(ctx, `INSERT INTO credentials
		(sub, capability_id, account_ref, nonce, ciphertext, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sub, capability_id, account_ref) DO UPDATE SET
			nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = excluded.updated_at`,
		sub, capabilityID, accountRef, nonce, ct, now, now)
	if err != nil {
		return fmt.Errorf("store: put credential: %w", err)
	}
	return nil
}

// Credential returns the material stored for (sub, capabilityID,
// accountRef), or ErrNotFound. A row that does not decrypt (another key,
// or a ciphertext moved from another row) is an error, never data.
func (s *Store) Credential(ctx context.Context, sub, capabilityID, accountRef string) ([]byte, error) {
	if s.vault == nil {
		return nil, ErrNoVault
	}
	var nonce, ct []byte
	err := s.vault.QueryRowContext(ctx, `SELECT nonce, ciphertext FROM credentials
		WHERE sub = ? AND capability_id = ? AND account_ref = ?`,
		sub, capabilityID, accountRef).Scan(&nonce, &ct)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: credential: %w", err)
	}
	if len(nonce) != s.aead.NonceSize() {
		return nil, fmt.Errorf("store: credential of %q for %s (account %q): malformed row", sub, capabilityID, accountRef)
	}
	pt, err := s.aead.Open(nil, nonce, ct, credentialAD(sub, capabilityID, accountRef))
	if err != nil {
		return nil, fmt.Errorf("store: credential of %q for %s (account %q) does not decrypt: "+
			"it was written under another key or belongs to another row", sub, capabilityID, accountRef)
	}
	return pt, nil
}

// Accounts lists, sorted, the account refs sub has credentials for under
// capabilityID.
func (s *Store) Accounts(ctx context.Context, sub, capabilityID string) ([]string, error) {
	if s.vault == nil {
		return nil, ErrNoVault
	}
	rows, err := s.vault.QueryContext(ctx, `SELECT account_ref FROM credentials
		WHERE sub = ? AND capability_id = ?`, sub, capabilityID)
	if err != nil {
		return nil, fmt.Errorf("store: accounts: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			return nil, fmt.Errorf("store: accounts: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: accounts: %w", err)
	}
	// Sorted here, not by ORDER BY, so that the order is byte order
	// whatever the database's collation.
	slices.Sort(out)
	return out, nil
}

// CredentialSubjects lists up to limit subjects holding a credential
// under (capabilityID, accountRef), the most recently written first: who
// may stand for everyone where one user's credential must (an upstream
// that lists its tools only to a signed-in user).
func (s *Store) CredentialSubjects(ctx context.Context, capabilityID, accountRef string, limit int) ([]string, error) {
	if s.vault == nil {
		return nil, ErrNoVault
	}
	rows, err := s.vault.QueryContext(ctx, `SELECT sub FROM credentials
		WHERE capability_id = ? AND account_ref = ? ORDER BY updated_at DESC, sub LIMIT ?`, capabilityID, accountRef, limit)
	if err != nil {
		return nil, fmt.Errorf("store: credential subjects: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var sub string
		if err := rows.Scan(&sub); err != nil {
			return nil, fmt.Errorf("store: credential subjects: %w", err)
		}
		out = append(out, sub)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: credential subjects: %w", err)
	}
	return out, nil
}

// DeleteCredential removes the credential of (sub, capabilityID,
// accountRef); ErrNotFound when there was none.
func (s *Store) DeleteCredential(ctx context.Context, sub, capabilityID, accountRef string) error {
	if s.vault == nil {
		return ErrNoVault
	}
	res, err := s.vault.ExecContext(ctx, `DELETE FROM credentials
		WHERE sub = ? AND capability_id = ? AND account_ref = ?`, sub, capabilityID, accountRef)
	if err != nil {
		return fmt.Errorf("store: delete credential: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: delete credential: %w", err)
	} else if n == 0 {
		return ErrNotFound
	}
	return nil
}

// keyCheckAD binds the key check value to its purpose.
var keyCheckAD = []byte("capgate vault key check v1")

// checkKey makes sure the key opens this vault, so that a changed key is
// an error at Open rather than at the first credential read. The first
// Open seals a check value; later ones must open it.
func (s *Store) checkKey(ctx context.Context) error {
	nonce, ct := s.seal([]byte("capgate"), keyCheckAD)
	value := append(nonce, ct...)
	if _, err := s.vault.ExecContext(ctx, `INSERT INTO vault_meta (name, value) VALUES ('key_check', ?)
		ON CONFLICT (name) DO NOTHING`, value); err != nil {
		return fmt.Errorf("store: %s: key check: %w", VaultFile, err)
	}
	if err := s.vault.QueryRowContext(ctx, `SELECT value FROM vault_meta WHERE name = 'key_check'`).Scan(&value); err != nil {
		return fmt.Errorf("store: %s: key check: %w", VaultFile, err)
	}
	n := s.aead.NonceSize()
	if len(value) < n {
		return fmt.Errorf("store: %s: key check: malformed", VaultFile)
	}
	if _, err := s.aead.Open(nil, value[:n], value[n:], keyCheckAD); err != nil {
		where := filepath.Join(s.dir, VaultFile)
		if s.Shared() {
			where = "the vault at " + s.where
		}
		return fmt.Errorf("store: the key from %s does not open %s: the vault was created with another key "+
			"(was %s changed, or %s replaced?)", s.keyFrom, where, KeyEnv, KeyFile)
	}
	return nil
}
