package store

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/capgate/capgate/internal/testkit/pgtest"
)

// The store's tests run twice, with the same assertions: on SQLite files
// and on a real PostgreSQL (pgtest). A test names a store by a directory;
// on PostgreSQL each directory gets its own database (and vault key, as a
// store.key would be), so tests that open two stores on one directory
// share one database, as two replicas do.
var backend = "sqlite"

func TestMain(m *testing.M) {
	if os.Getenv("STORE_HELPER_DIR") != "" {
		os.Exit(m.Run()) // a child of TestApproveFromAnotherProcess
	}
	fmt.Println("store: tests on sqlite")
	code := m.Run()
	backend = "postgres"
	fmt.Println("store: tests on postgres")
	if c := pgtest.Run(m); code == 0 {
		code = c
	}
	os.Exit(code)
}

type pgDir struct {
	url string
	key []byte
}

var (
	pgDirsMu sync.Mutex
	pgDirs   = map[string]pgDir{}
)

// pgFor is the database (and key) standing for dir on PostgreSQL.
func pgFor(tb testing.TB, dir string) pgDir {
	tb.Helper()
	pgDirsMu.Lock()
	defer pgDirsMu.Unlock()
	d, ok := pgDirs[dir]
	if !ok {
		d = pgDir{url: pgtest.Start(tb), key: randomKey(tb)}
		pgDirs[dir] = d
	}
	return d
}

// testOpen is Open on the backend under test.
func testOpen(tb testing.TB, dir string, opts Options) (*Store, error) {
	tb.Helper()
	if backend != "postgres" {
		return Open(context.Background(), dir, opts)
	}
	d := pgFor(tb, dir)
	opts.URL = d.url
	if opts.Key == nil && !opts.WithoutVault {
		lookup := opts.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		if _, ok := lookup(KeyEnv); !ok {
			opts.Key = d.key
		}
	}
	return Open(context.Background(), dir, opts)
}

// sqliteOnly skips a test of what only the SQLite files have.
func sqliteOnly(t *testing.T) {
	t.Helper()
	if backend != "sqlite" {
		t.Skipf("about SQLite files; not on %s", backend)
	}
}

// vaultVersions is the table of the vault's schema versions.
func vaultVersions() string {
	if backend == "postgres" {
		return "vault_schema_migrations"
	}
	return "schema_migrations"
}
