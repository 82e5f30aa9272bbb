package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable Now for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// noEnv is a LookupEnv with nothing set, so the tests do not depend on the
// environment they run in.
func noEnv(string) (string, bool) { return "", false }

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// mustOpen opens a store under dir with the key file and c's clock.
func mustOpen(tb testing.TB, dir string, c *clock) *Store {
	tb.Helper()
	opts := Options{LookupEnv: noEnv}
	if c != nil {
		opts.Now = c.Now
	}
	s, err := testOpen(tb, dir, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func randomKey(tb testing.TB) []byte {
	tb.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

type migrationRow struct {
	version, appliedAt int64
}

func migrationRows(t *testing.T, db *sql.DB, table string) []migrationRow {
	t.Helper()
	rows, err := db.Query(`SELECT version, applied_at FROM ` + table + ` ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []migrationRow
	for rows.Next() {
		var r migrationRow
		if err := rows.Scan(&r.version, &r.appliedAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMigrationsApplyOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newClock()
	s := mustOpen(t, dir, c)
	ops, vault := migrationRows(t, s.ops, "schema_migrations"), migrationRows(t, s.vault, vaultVersions())
	if len(ops) != len(opsMigrations) || len(vault) != len(vaultMigrations) {
		t.Fatalf("capgate.db versions %v, vault.db versions %v; want %d and %d", ops, vault, len(opsMigrations), len(vaultMigrations))
	}
	for i, r := range ops {
		if r.version != int64(i+1) || r.appliedAt != ms(c.Now()) {
			t.Errorf("capgate.db migration row %d: %+v", i, r)
		}
	}
	if _, err := s.BeginFlow(context.Background(), "alice", "cap", "", nil); err != nil {
		t.Fatal(err)
	}
	s.Close()

	c.Advance(time.Hour)
	s = mustOpen(t, dir, c)
	if got := migrationRows(t, s.ops, "schema_migrations"); !equalRows(got, ops) {
		t.Errorf("after reopening, capgate.db schema_migrations %v, want unchanged %v", got, ops)
	}
	if got := migrationRows(t, s.vault, vaultVersions()); !equalRows(got, vault) {
		t.Errorf("after reopening, vault.db schema_migrations %v, want unchanged %v", got, vault)
	}
	var n int
	if err := s.ops.QueryRow(`SELECT COUNT(*) FROM auth_flows`).Scan(&n); err != nil || n != 1 {
		t.Errorf("after reopening, %d flows (%v), want the 1 begun before", n, err)
	}
}

func equalRows(a, b []migrationRow) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMigrateAddsPending runs migrate on a plain database with growing
// lists, as successive capgate versions would.
func TestMigrateAddsPending(t *testing.T) {
	t.Parallel()
	sqliteOnly(t) // the same migrate runs on PostgreSQL in TestMigrationsApplyOnce
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := newClock()
	v1 := migration{1, []string{`CREATE TABLE a (x INTEGER)`}}
	v2 := migration{2, []string{`CREATE TABLE b (y INTEGER)`, `INSERT INTO b VALUES (2)`}}
	v3bad := migration{3, []string{`CREATE TABLE c (z INTEGER)`, `INSERT INTO nowhere VALUES (1)`}}

	if err := migrate(ctx, db, dialectSQLite, "m.db", "schema_migrations", []migration{v1}, c.Now); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO a VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	t0 := ms(c.Now())
	c.Advance(time.Minute)
	if err := migrate(ctx, db, dialectSQLite, "m.db", "schema_migrations", []migration{v1, v2}, c.Now); err != nil {
		t.Fatal(err)
	}
	want := []migrationRow{{1, t0}, {2, t0 + 60_000}}
	if got := migrationRows(t, db, "schema_migrations"); !equalRows(got, want) {
		t.Fatalf("schema_migrations %v, want %v", got, want)
	}
	c.Advance(time.Minute)
	if err := migrate(ctx, db, dialectSQLite, "m.db", "schema_migrations", []migration{v1, v2}, c.Now); err != nil {
		t.Fatal(err)
	}
	if got := migrationRows(t, db, "schema_migrations"); !equalRows(got, want) {
		t.Fatalf("a second run changed schema_migrations to %v", got)
	}
	var x, y int
	if err := db.QueryRow(`SELECT (SELECT x FROM a), (SELECT y FROM b)`).Scan(&x, &y); err != nil || x != 1 || y != 2 {
		t.Fatalf("data after migrations: a.x=%d b.y=%d (%v)", x, y, err)
	}

	// A failing migration leaves nothing of itself behind.
	err = migrate(ctx, db, dialectSQLite, "m.db", "schema_migrations", []migration{v1, v2, v3bad}, c.Now)
	if err == nil || !strings.Contains(err.Error(), "m.db: migration 3") {
		t.Fatalf("bad migration: %v", err)
	}
	if got := migrationRows(t, db, "schema_migrations"); !equalRows(got, want) {
		t.Errorf("after a failed migration schema_migrations %v, want %v", got, want)
	}
	if _, err := db.Exec(`SELECT * FROM c`); err == nil {
		t.Error("the failed migration's first statement was kept")
	}
}

func TestFutureSchemaRefused(t *testing.T) {
	t.Parallel()
	for _, file := range []string{OpsFile, VaultFile} {
		t.Run(file, func(t *testing.T) {
			dir := t.TempDir()
			s := mustOpen(t, dir, nil)
			db := s.ops
			if file == VaultFile {
				db = s.vault
			}
			table, name := "schema_migrations", file
			if file == VaultFile {
				table = vaultVersions()
			}
			if backend == "postgres" {
				name = map[string]string{OpsFile: "ops", VaultFile: "vault"}[file] + " schema at postgres://"
			}
			if _, err := db.Exec(`INSERT INTO ` + table + ` (version, applied_at) VALUES (99, 0)`); err != nil {
				t.Fatal(err)
			}
			s.Close()
			_, err := testOpen(t, dir, Options{LookupEnv: noEnv})
			if err == nil {
				t.Fatal("opened a database with schema version 99")
			}
			for _, want := range []string{name, " has schema version 99", "newer than this capgate knows"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestKeyFileCreated(t *testing.T) {
	t.Parallel()
	sqliteOnly(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data", "capgate")
	s := mustOpen(t, dir, nil)
	if err := s.PutCredential(ctx, "alice", "cap", "", []byte("secret")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	keyPath := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := hex.DecodeString(strings.TrimSuffix(string(data), "\n")); err != nil || len(k) != 32 {
		t.Errorf("store.key holds %q, want 64 hex characters and a newline", data)
	}
	if runtime.GOOS != "windows" {
		for path, want := range map[string]os.FileMode{
			dir: 0o700, keyPath: 0o600, filepath.Join(dir, OpsFile): 0o600, filepath.Join(dir, VaultFile): 0o600,
		} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("%s has mode %04o, want %04o", path, got, want)
			}
		}
	}
	// The next Open reads the same key.
	s = mustOpen(t, dir, nil)
	if got, err := s.Credential(ctx, "alice", "cap", ""); err != nil || string(got) != "secret" {
		t.Errorf("after reopening: %q, %v", got, err)
	}
	if data2, _ := os.ReadFile(keyPath); !bytes.Equal(data, data2) {
		t.Error("store.key was rewritten")
	}
}

func TestKeyFileModeRefused(t *testing.T) {
	t.Parallel()
	sqliteOnly(t)
	if runtime.GOOS == "windows" {
		t.Skip("no Unix modes")
	}
	dir := t.TempDir()
	mustOpen(t, dir, nil).Close()
	keyPath := filepath.Join(dir, KeyFile)
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		if err := os.Chmod(keyPath, mode); err != nil {
			t.Fatal(err)
		}
		_, err := testOpen(t, dir, Options{LookupEnv: noEnv})
		if err == nil || !strings.Contains(err.Error(), "chmod 600 "+keyPath) {
			t.Errorf("key file mode %04o: %v, want a refusal that says chmod 600 %s", mode, err, keyPath)
		}
	}
	if err := os.Chmod(keyPath, 0o600); err != nil {
		t.Fatal(err)
	}
	mustOpen(t, dir, nil)
}

func TestKeyFileMalformed(t *testing.T) {
	t.Parallel()
	sqliteOnly(t)
	dir := t.TempDir()
	keyPath := filepath.Join(dir, KeyFile)
	secret := strings.Repeat("zq", 32)
	if err := os.WriteFile(keyPath, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := testOpen(t, dir, Options{LookupEnv: noEnv})
	if err == nil || !strings.Contains(err.Error(), "want 64 hex characters") || strings.Contains(err.Error(), secret) {
		t.Errorf("malformed key file: %v", err)
	}
}

func TestKeyEnv(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := randomKey(t)
	forms := map[string]string{
		"hex":           hex.EncodeToString(key),
		"HEX":           strings.ToUpper(hex.EncodeToString(key)),
		"base64":        base64.StdEncoding.EncodeToString(key),
		"base64 raw":    base64.RawStdEncoding.EncodeToString(key),
		"base64url":     base64.URLEncoding.EncodeToString(key),
		"base64url raw": base64.RawURLEncoding.EncodeToString(key),
		"hex newline":   hex.EncodeToString(key) + "\n",
	}
	for name, v := range forms {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := testOpen(t, dir, Options{LookupEnv: env(map[string]string{KeyEnv: v})})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.PutCredential(ctx, "alice", "cap", "", []byte("m")); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if _, err := os.Stat(filepath.Join(dir, KeyFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("with %s set, store.key was made (%v)", KeyEnv, err)
			}
			// The same 32 bytes, given directly, open what the variable sealed.
			s, err = testOpen(t, dir, Options{Key: key, LookupEnv: noEnv})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got, err := s.Credential(ctx, "alice", "cap", ""); err != nil || string(got) != "m" {
				t.Errorf("%q, %v", got, err)
			}
		})
	}

	bad := map[string]string{
		"short":         "hunter2-not-a-key",
		"63 hex":        hex.EncodeToString(key)[:63],
		"64 non-hex":    strings.Repeat("g", 64),
		"base64 16":     base64.StdEncoding.EncodeToString(key[:16]),
		"base64 33":     base64.StdEncoding.EncodeToString(append(key, 1)),
		"empty":         "",
		"hex with junk": hex.EncodeToString(key) + "!",
	}
	for name, v := range bad {
		t.Run("bad "+name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := testOpen(t, dir, Options{LookupEnv: env(map[string]string{KeyEnv: v})})
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, KeyEnv) || !strings.Contains(msg, "64 hex characters or the base64") {
				t.Errorf("error %q does not name %s and the expected form", msg, KeyEnv)
			}
			if v != "" && strings.Contains(msg, strings.TrimSpace(v)) {
				t.Errorf("error %q shows the value", msg)
			}
			if _, err := os.Stat(filepath.Join(dir, KeyFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a bad %s fell back to store.key (%v)", KeyEnv, err)
			}
		})
	}
}

func TestOptionsKeyLength(t *testing.T) {
	t.Parallel()
	_, err := testOpen(t, t.TempDir(), Options{Key: make([]byte, 16)})
	if err == nil || !strings.Contains(err.Error(), "want 32") {
		t.Errorf("16-byte key: %v", err)
	}
}

func TestWrongKeyRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	keyA, keyB := randomKey(t), randomKey(t)
	s, err := testOpen(t, dir, Options{Key: keyA})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutCredential(ctx, "alice", "cap", "", []byte("material")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = testOpen(t, dir, Options{Key: keyB})
	if err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("open with another key: %v", err)
	}

	// Past the check at Open, a row still refuses another key.
	s, err = testOpen(t, dir, Options{Key: keyA})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.aead, err = newAEAD(keyB); err != nil {
		t.Fatal(err)
	}
	got, err := s.Credential(ctx, "alice", "cap", "")
	if err == nil || errors.Is(err, ErrNotFound) || got != nil {
		t.Errorf("read under another key: %q, %v; want an error and no data", got, err)
	}
}

func TestWithoutVault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	s, err := testOpen(t, dir, Options{WithoutVault: true, LookupEnv: env(map[string]string{KeyEnv: "garbage"})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(dir, KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WithoutVault made a key file (%v)", err)
	}
	if err := s.PutCredential(ctx, "a", "c", "", nil); !errors.Is(err, ErrNoVault) {
		t.Errorf("PutCredential: %v", err)
	}
	if _, err := s.RequestApproval(ctx, "a", "t", "h", nil, time.Minute); err != nil {
		t.Errorf("operation data without the vault: %v", err)
	}
}

func TestPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	if _, err := s.BeginFlow(ctx, "alice", "cap", "", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.PutIdempotency(ctx, "alice", "tool", "k", "h", nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestApproval(ctx, "alice", "tool", "h", nil, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.PutIdempotency(ctx, "alice", "tool", "long", "h", nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	count := func() (n [3]int) {
		for i, table := range []string{"auth_flows", "idempotency", "approvals"} {
			if err := s.ops.QueryRow(`SELECT COUNT(*) FROM ` + table).Scan(&n[i]); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != [3]int{1, 2, 1} {
		t.Fatalf("Prune removed live rows: %v", n)
	}
	c.Advance(FlowTTL + time.Second)
	if err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != [3]int{0, 1, 0} {
		t.Errorf("after expiry, rows left (flows, idempotency, approvals) = %v, want [0 1 0]", n)
	}
	buckets := func() (n int) {
		if err := s.ops.QueryRow(`SELECT COUNT(*) FROM rate_buckets`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := s.TakeToken(ctx, "alice", "tool", 1, 5); err != nil {
		t.Fatal(err)
	}
	c.Advance(bucketTTL - time.Minute)
	if err := s.Prune(ctx); err != nil || buckets() != 1 {
		t.Fatalf("Prune removed a bucket used within a day (%v)", err)
	}
	c.Advance(time.Minute)
	if err := s.Prune(ctx); err != nil || buckets() != 0 {
		t.Errorf("a bucket untouched for a day was kept (%v)", err)
	}
}
