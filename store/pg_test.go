package store

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func pgOnly(t *testing.T) {
	t.Helper()
	if backend != "postgres" {
		t.Skipf("about PostgreSQL; not on %s", backend)
	}
}

// TestPGConcurrentOpens: replicas starting together against a fresh
// database all open it, and the schema is applied once.
func TestPGConcurrentOpens(t *testing.T) {
	t.Parallel()
	pgOnly(t)
	dir := t.TempDir()
	d := pgFor(t, dir)
	c := newClock()
	const n = 4
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = Open(context.Background(), "", Options{URL: d.url, Key: d.key, LookupEnv: noEnv, Now: c.Now})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	ops := migrationRows(t, stores[0].ops, "schema_migrations")
	vault := migrationRows(t, stores[0].ops, "vault_schema_migrations")
	if len(ops) != len(opsMigrations) || len(vault) != len(vaultMigrations) {
		t.Errorf("ops versions %v, vault versions %v; want %d and %d rows, each version once", ops, vault, len(opsMigrations), len(vaultMigrations))
	}
	// Each sees the others' writes: one database.
	if err := stores[1].PutCredential(context.Background(), "alice", "cap", "", []byte("m")); err != nil {
		t.Fatal(err)
	}
	if got, err := stores[3].Credential(context.Background(), "alice", "cap", ""); err != nil || string(got) != "m" {
		t.Errorf("credential across replicas: %q, %v", got, err)
	}
}

// TestPGKeyFromEnvOnly: with a URL the vault key must be shared, so the
// store.key fallback is refused.
func TestPGKeyFromEnvOnly(t *testing.T) {
	t.Parallel()
	pgOnly(t)
	d := pgFor(t, t.TempDir())
	_, err := Open(context.Background(), t.TempDir(), Options{URL: d.url, LookupEnv: noEnv})
	if err == nil || !strings.Contains(err.Error(), "set "+KeyEnv) || !strings.Contains(err.Error(), "split the vault") {
		t.Fatalf("open without %s: %v", KeyEnv, err)
	}
	s, err := Open(context.Background(), "", Options{URL: d.url, LookupEnv: env(map[string]string{KeyEnv: strings.Repeat("ab", 32)})})
	if err != nil {
		t.Fatalf("open with %s: %v", KeyEnv, err)
	}
	s.Close()
	// The CLI's operation-data store needs no key.
	s, err = Open(context.Background(), "", Options{URL: d.url, LookupEnv: noEnv, WithoutVault: true})
	if err != nil {
		t.Fatalf("open WithoutVault: %v", err)
	}
	s.Close()
}

// TestPGPasswordNotShown: no error shows the URL's password.
func TestPGPasswordNotShown(t *testing.T) {
	t.Parallel()
	pgOnly(t)
	d := pgFor(t, t.TempDir())
	port := d.url[strings.LastIndex(d.url, ":")+1 : strings.LastIndex(d.url, "/")]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range []string{
		// a user that does not exist: the server refuses the login
		"postgres://nobody:s3cret-PW-1@127.0.0.1:" + port + "/postgres?sslmode=disable",
		// a port where nothing listens
		"postgres://postgres:s3cret-PW-1@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2",
		"postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&password=s3cret-PW-1&connect_timeout=2",
		"postgres://postgres:s3cret-PW-1@127.0.0.1:notaport/x",
	} {
		_, err := Open(ctx, "", Options{URL: u, Key: randomKey(t)})
		if err == nil {
			t.Fatalf("%s opened", RedactURL(u))
		}
		if strings.Contains(err.Error(), "s3cret-PW-1") {
			t.Errorf("error shows the password: %v", err)
		}
		if !strings.Contains(err.Error(), "127.0.0.1") && !strings.Contains(err.Error(), "not a valid PostgreSQL connection URL") {
			t.Errorf("error does not say which database: %v", err)
		}
	}
}

func TestNumbered(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`SELECT 1`:                             `SELECT 1`,
		`a = ? AND b = ?`:                      `a = $1 AND b = $2`,
		`x = '?' AND y = ? AND "q?" = ?`:       `x = '?' AND y = $1 AND "q?" = $2`,
		`INSERT INTO t VALUES (?, 'it''s', ?)`: `INSERT INTO t VALUES ($1, 'it''s', $2)`,
	} {
		if got := numbered(in); got != want {
			t.Errorf("numbered(%q) = %q, want %q", in, got, want)
		}
	}
}
