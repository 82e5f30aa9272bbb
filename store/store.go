// Package store keeps capgate's state: credentials, auth flows, idempotency
// records and operator approvals.
//
// The embedded backend is SQLite (modernc.org/sqlite, no cgo) in WAL mode
// under a data directory, so that a CLI process (capgate approve) can work
// beside a running server. Two files keep credentials apart from operation
// data:
//
//	<dir>/vault.db    credentials, encrypted with AES-256-GCM
//	<dir>/capgate.db  auth flows, idempotency records, approvals
//	<dir>/store.key   the vault key, when CAPGATE_STORE_KEY is not set
//
// Each file carries its own schema_migrations table; Open applies what is
// missing and refuses a file whose schema is newer than this code.
//
// With Options.URL the backend is PostgreSQL instead (see pg.go): one
// database that several replicas share, holding both files' tables.
//
// The SQL is kept portable to PostgreSQL: plain TEXT, INTEGER and BLOB
// columns, times as unix milliseconds, ON CONFLICT upserts and RETURNING
// (both understood by SQLite 3.35+ and PostgreSQL). Statements use ?
// placeholders; the PostgreSQL connection numbers them ($1, $2, ...) and
// its migrations swap BLOB for BYTEA and INTEGER for BIGINT.
package store

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/capgate/capgate/router/state"
)

// Errors the callers match with errors.Is.
var (
	// ErrNotFound: no such credential, idempotency record (or an expired
	// one) or usable approval (router/state's, which the router matches).
	ErrNotFound = state.ErrNotFound
	// ErrFlowInvalid: TakeFlow of a flow that is unknown, expired, already
	// taken or began by another subject (router/state's).
	ErrFlowInvalid = state.ErrFlowInvalid
	// ErrExists: PutIdempotency found a live record under the key; the
	// first writer's record stands.
	ErrExists = errors.New("store: a live record already exists")
	// ErrNoVault: a credential method on a Store opened WithoutVault.
	ErrNoVault = errors.New("store: opened without the credential vault")
)

// FlowTTL is how long an auth flow may be completed after it began.
const FlowTTL = 10 * time.Minute

// File names under the data directory.
const (
	OpsFile   = "capgate.db"
	VaultFile = "vault.db"
	KeyFile   = "store.key"
)

// busyTimeout is how long a statement waits for another connection or
// process to release a lock before it fails with SQLITE_BUSY.
const busyTimeout = 5 * time.Second

// Options are the seams of Open. The zero value reads the key from the
// environment or the key file and uses the real clock.
type Options struct {
	// Key is the 32-byte vault key; it overrides CAPGATE_STORE_KEY and
	// store.key.
	Key []byte
	// LookupEnv reads CAPGATE_STORE_KEY; default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Now is the clock; default time.Now.
	Now func() time.Time
	// WithoutVault opens capgate.db only: no key is read or created and
	// the credential methods return ErrNoVault. For commands that touch
	// operation data only (capgate approve), so they work in a shell that
	// lacks the server's CAPGATE_STORE_KEY.
	WithoutVault bool
	// URL, a postgres:// URL, selects the PostgreSQL backend; the data
	// directory is then unused. The vault key must come from Key or
	// CAPGATE_STORE_KEY: every replica shares it, and a store.key made by
	// each would split the vault.
	URL string
}

// Store is capgate's state. It is safe for concurrent use, and several
// Stores (in one process or many) may share a data directory.
type Store struct {
	dir   string
	ops   *sql.DB
	vault *sql.DB     // nil when opened WithoutVault
	aead  cipher.AEAD // nil when opened WithoutVault
	// keyFrom says where the key came from, for messages.
	keyFrom string
	now     func() time.Time
	dialect dialect
	// where names the database for messages: the data directory, or the
	// URL without its password.
	where string
	// stmts counts the statements sent to PostgreSQL: how a test proves a
	// call made no round trip.
	stmts atomic.Int64
}

// Open opens (creating when missing) the store under dir: the directory
// with mode 0700, capgate.db and, unless opts.WithoutVault, the key and
// vault.db. It applies pending schema migrations.
func Open(ctx context.Context, dir string, opts Options) (_ *Store, err error) {
	if opts.URL != "" {
		return openShared(ctx, opts)
	}
	if dir == "" {
		return nil, errors.New("store: no data directory given")
	}
	// Absolute, so that the driver can never read the name as a file: URI.
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: data directory: %w", err)
	}
	if strings.ContainsRune(dir, '?') {
		// The driver reads everything after the first ? as parameters.
		return nil, fmt.Errorf("store: data directory %q: a path with ? is not supported", dir)
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data directory: %w", err)
	}
	s := &Store{dir: dir, now: opts.Now, where: dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	if !opts.WithoutVault {
		key, from, err := loadKey(dir, opts)
		if err != nil {
			return nil, err
		}
		if s.aead, err = newAEAD(key); err != nil {
			return nil, err
		}
		s.keyFrom = from
	}

	if s.ops, err = openDB(ctx, filepath.Join(dir, OpsFile), opsMigrations, s.now); err != nil {
		return nil, err
	}
	if !opts.WithoutVault {
		if s.vault, err = openDB(ctx, filepath.Join(dir, VaultFile), vaultMigrations, s.now); err != nil {
			return nil, err
		}
		if err := s.checkKey(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// openShared opens the PostgreSQL store at opts.URL.
func openShared(ctx context.Context, opts Options) (_ *Store, err error) {
	if !IsPostgresURL(opts.URL) {
		return nil, fmt.Errorf("store: url %s: want a postgres:// or postgresql:// URL", RedactURL(opts.URL))
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{now: opts.Now, dialect: dialectPG, where: RedactURL(opts.URL)}
	if !opts.WithoutVault {
		if opts.Key == nil {
			if _, ok := opts.LookupEnv(KeyEnv); !ok {
				return nil, fmt.Errorf("store: url %s is a shared store: set %s to the vault key every replica shares "+
					"(openssl rand -hex 32 makes one); a %s per replica would split the vault", s.where, KeyEnv, KeyFile)
			}
		}
		key, from, err := loadKey("", opts)
		if err != nil {
			return nil, err
		}
		if s.aead, err = newAEAD(key); err != nil {
			return nil, err
		}
		s.keyFrom = from
	}
	if s.ops, err = openPG(ctx, opts.URL, opts.WithoutVault, s.now, &s.stmts); err != nil {
		return nil, err
	}
	if !opts.WithoutVault {
		s.vault = s.ops // one database holds both
		if err := s.checkKey(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Statements is how many statements this Store has sent to PostgreSQL
// (0 on SQLite, which has no round trips to count).
func (s *Store) Statements() int64 { return s.stmts.Load() }

// Shared says whether the store is shared among replicas (PostgreSQL).
func (s *Store) Shared() bool { return s.dialect == dialectPG }

// Ping says whether the store answers a query: what a replica's
// readiness reports.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.ops.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Close closes the databases.
func (s *Store) Close() error {
	var errs []error
	if s.ops != nil {
		errs = append(errs, s.ops.Close())
	}
	if s.vault != nil && s.vault != s.ops {
		errs = append(errs, s.vault.Close())
	}
	return errors.Join(errs...)
}

// Prune deletes expired auth flows, idempotency records, approvals,
// once claims and tasks, and rate-limit buckets untouched for a day.
func (s *Store) Prune(ctx context.Context) error {
	now := s.nowMS()
	for _, table := range []string{"auth_flows", "idempotency", "approvals", "once_claims", "tasks"} {
		if _, err := s.ops.ExecContext(ctx, `DELETE FROM `+table+` WHERE expires_at <= ?`, now); err != nil {
			return fmt.Errorf("store: prune %s: %w", table, err)
		}
	}
	if _, err := s.ops.ExecContext(ctx, `DELETE FROM rate_buckets WHERE updated_at <= ?`, now-bucketTTL.Milliseconds()); err != nil {
		return fmt.Errorf("store: prune rate_buckets: %w", err)
	}
	return nil
}

// openDB opens one SQLite file in WAL mode and migrates it.
func openDB(ctx context.Context, path string, migrations []migration, now func() time.Time) (*sql.DB, error) {
	// SQLite gives the -wal and -shm files the mode of the database file,
	// so creating it 0600 keeps all three private.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	f.Close()
	// busy_timeout is applied first by the driver. _txlock=immediate takes
	// the write lock at BEGIN, so a transaction that reads then writes
	// waits for another writer instead of failing to upgrade its lock.
	dsn := path + fmt.Sprintf("?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_txlock=immediate",
		busyTimeout.Milliseconds())
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", filepath.Base(path), err)
	}
	// Each connection has its own page cache; bound the pool and keep the
	// connections, so the pragmas run once per connection, not per query.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	if err := migrate(ctx, db, dialectSQLite, filepath.Base(path), "schema_migrations", migrations, now); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// newID returns prefix followed by 128 random bits in hex.
func newID(prefix string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand.Read does not fail on supported platforms.
		panic("store: crypto/rand: " + err.Error())
	}
	return prefix + hex.EncodeToString(b[:])
}

// ms is t in unix milliseconds, the form every time is stored in.
func ms(t time.Time) int64 { return t.UnixMilli() }

// fromMS is the inverse of ms; a NULL column reads as the zero time.
func fromMS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMilli(v.Int64)
}

// nowMS is the store's clock truncated to what is stored.
func (s *Store) nowMS() int64 { return ms(s.now()) }
