package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// A migration is one schema version: its statements run in order, in the
// same transaction as the others pending and the schema_migrations rows
// that record them. Versions only grow; an applied migration is never
// edited, a change is a new one.
type migration struct {
	version int
	stmts   []string
}

// opsMigrations build capgate.db.
var opsMigrations = []migration{
	{1, []string{
		`CREATE TABLE auth_flows (
			id            TEXT PRIMARY KEY,
			sub           TEXT NOT NULL,
			capability_id TEXT NOT NULL,
			account_hint  TEXT NOT NULL,
			state         BLOB,
			created_at    INTEGER NOT NULL,
			expires_at    INTEGER NOT NULL
		)`,
		`CREATE INDEX auth_flows_expires ON auth_flows (expires_at)`,
		`CREATE TABLE idempotency (
			sub        TEXT NOT NULL,
			tool_id    TEXT NOT NULL,
			idem_key   TEXT NOT NULL,
			input_hash TEXT NOT NULL,
			result     BLOB,
			created_at INTEGER NOT NULL,
			expires_at INTEGER NOT NULL,
			PRIMARY KEY (sub, tool_id, idem_key)
		)`,
		`CREATE INDEX idempotency_expires ON idempotency (expires_at)`,
		`CREATE TABLE approvals (
			id          TEXT PRIMARY KEY,
			sub         TEXT NOT NULL,
			tool_id     TEXT NOT NULL,
			input_hash  TEXT NOT NULL,
			created_at  INTEGER NOT NULL,
			expires_at  INTEGER NOT NULL,
			approved_at INTEGER,
			approved_by TEXT,
			used_at     INTEGER
		)`,
		// Unused approvals only: used ones (kept until they expire) stay
		// out of the lookups of RequestApproval and UseApproval.
		`CREATE INDEX approvals_live ON approvals (sub, tool_id, input_hash, created_at) WHERE used_at IS NULL`,
		`CREATE INDEX approvals_expires ON approvals (expires_at)`,
	}},
	{2, []string{
		// A call with an idempotency key claims it before it runs: a row
		// whose claim names the call, with no result yet. Completion sets
		// the result and clears the claim.
		`ALTER TABLE idempotency ADD COLUMN claim TEXT`,
		// What the operator approves: the canonical input the tool would
		// get (its first MaxApprovalInput bytes) and its full size.
		`ALTER TABLE approvals ADD COLUMN input BLOB`,
		`ALTER TABLE approvals ADD COLUMN input_size INTEGER`,
	}},
	{3, []string{
		// A rate limit's buckets, when replicas share the store (see
		// limits.go). A bucket keeps its rate, so that a take refills it
		// in one statement.
		`CREATE TABLE rate_buckets (
			sub        TEXT NOT NULL,
			tool_id    TEXT NOT NULL,
			tokens     DOUBLE PRECISION NOT NULL,
			updated_at INTEGER NOT NULL,
			per_ms     DOUBLE PRECISION NOT NULL,
			burst      DOUBLE PRECISION NOT NULL,
			PRIMARY KEY (sub, tool_id)
		)`,
		`CREATE INDEX rate_buckets_updated ON rate_buckets (updated_at)`,
	}},
	{4, []string{
		// Keys used once (ClaimOnce): a sealed requestState is consumed at
		// most once across the replicas that share the store.
		`CREATE TABLE once_claims (
			claim_key  TEXT PRIMARY KEY,
			created_at INTEGER NOT NULL,
			expires_at INTEGER NOT NULL
		)`,
		`CREATE INDEX once_claims_expires ON once_claims (expires_at)`,
	}},
	{5, []string{
		// An idempotency claim is a lease its holder renews while the call
		// runs (ClaimIdempotency): past lease_until, its holder is dead.
		`ALTER TABLE idempotency ADD COLUMN lease_until INTEGER`,
	}},
	{6, []string{
		// An operator may deny a pending approval (the console): the
		// caller's next try, or its held call, fails with approval_denied.
		// note is the operator's optional word to the caller.
		`ALTER TABLE approvals ADD COLUMN denied_at INTEGER`,
		`ALTER TABLE approvals ADD COLUMN denied_by TEXT`,
		`ALTER TABLE approvals ADD COLUMN note TEXT`,
	}},
	{7, []string{
		// Tasks upstreams made of calls (the MCP tasks extension), under
		// capgate's own ids: whose each is, on every replica (tasks.go).
		`CREATE TABLE tasks (
			id          TEXT PRIMARY KEY,
			sub         TEXT NOT NULL,
			tool_id     TEXT NOT NULL,
			upstream_id TEXT NOT NULL,
			request_id  TEXT NOT NULL,
			created_at  INTEGER NOT NULL,
			expires_at  INTEGER NOT NULL
		)`,
		`CREATE INDEX tasks_expires ON tasks (expires_at)`,
	}},
}

// vaultMigrations build vault.db.
var vaultMigrations = []migration{
	{1, []string{
		`CREATE TABLE credentials (
			sub           TEXT NOT NULL,
			capability_id TEXT NOT NULL,
			account_ref   TEXT NOT NULL,
			nonce         BLOB NOT NULL,
			ciphertext    BLOB NOT NULL,
			created_at    INTEGER NOT NULL,
			updated_at    INTEGER NOT NULL,
			PRIMARY KEY (sub, capability_id, account_ref)
		)`,
		// name -> value; holds the key check (see checkKey).
		`CREATE TABLE vault_meta (
			name  TEXT PRIMARY KEY,
			value BLOB NOT NULL
		)`,
	}},
}

// migrate brings the database to the last version of list, in one
// transaction. name is the file, for messages. A database with a version
// beyond list is refused: it was written by a newer capgate.
//
// The versions are kept in table (schema_migrations in each SQLite file;
// PostgreSQL holds both lists in one database, so each has its own).
//
// On SQLite the transaction begins IMMEDIATE (see the DSN), so two
// processes opening the same file at once apply the migrations once. On
// PostgreSQL it first takes a transaction-scoped advisory lock, for the
// same effect among replicas starting together.
func migrate(ctx context.Context, db *sql.DB, d dialect, name, table string, list []migration, now func() time.Time) error {
	for i, m := range list {
		if m.version != i+1 {
			panic(fmt.Sprintf("store: %s migration %d has version %d", name, i, m.version))
		}
	}
	latest := int64(len(list))
	// Most opens find the schema current: a read tells, and it takes no
	// write lock, so opening beside a busy server does not wait for one.
	// An error here (no schema_migrations yet) is for the write path.
	var cur sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM `+table).Scan(&cur); err == nil {
		if err := checkVersion(name, cur.Int64, latest); err != nil || cur.Int64 == latest {
			return err
		}
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: %s: %w", name, err)
	}
	defer tx.Rollback()
	if d == dialectPG {
		// Held until commit: a replica that waited here finds the schema
		// current below. (CREATE TABLE IF NOT EXISTS alone races.)
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(migrateLock)); err != nil {
			return fmt.Errorf("store: %s: migration lock: %w", name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, d.ddl(`CREATE TABLE IF NOT EXISTS `+table+` (
		version    INTEGER PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`)); err != nil {
		return fmt.Errorf("store: %s: %s: %w", name, table, err)
	}
	// Again, under the write lock: another process may have migrated.
	if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM `+table).Scan(&cur); err != nil {
		return fmt.Errorf("store: %s: schema version: %w", name, err)
	}
	if err := checkVersion(name, cur.Int64, latest); err != nil || cur.Int64 == latest {
		return err
	}
	for _, m := range list[cur.Int64:] {
		for _, stmt := range m.stmts {
			if _, err := tx.ExecContext(ctx, d.ddl(stmt)); err != nil {
				return fmt.Errorf("store: %s: migration %d: %w", name, m.version, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (version, applied_at) VALUES (?, ?)`,
			m.version, ms(now())); err != nil {
			return fmt.Errorf("store: %s: migration %d: %w", name, m.version, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: %s: migrations: %w", name, err)
	}
	return nil
}

// checkVersion refuses a schema newer than this code knows.
func checkVersion(name string, cur, latest int64) error {
	if cur > latest {
		return fmt.Errorf("store: %s has schema version %d, newer than this capgate knows (%d): "+
			"it was written by a newer capgate; run that one, or point data_dir elsewhere", name, cur, latest)
	}
	return nil
}
