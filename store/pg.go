package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// The PostgreSQL backend keeps every table of capgate.db and vault.db in
// one database, so that replicas share them. The statements are the
// SQLite ones: the connector below numbers their ? placeholders, and the
// migrations' DDL is translated by pgDDL. Nothing else differs.

// pgPoolSize bounds the connections of one replica. A call holds one for
// a single statement (an approval request for a short transaction), so a
// few serve many concurrent calls; PostgreSQL's default max_connections
// (100) leaves room for a dozen replicas and the CLI.
const pgPoolSize = 8

// migrateLock is the pg_advisory_xact_lock key every replica takes before
// it migrates: ("capg" as an int32 in the high half, 1 in the low).
const migrateLock = 0x63617067_00000001

// IsPostgresURL says whether url names a PostgreSQL database.
func IsPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// RedactURL is u with its password replaced, for messages: no message of
// the store shows a database password.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		// Too malformed to parse: show only the scheme.
		if i := strings.Index(u, "://"); i >= 0 {
			return u[:i+3] + "…"
		}
		return "(unparsable URL)"
	}
	q := p.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		p.RawQuery = q.Encode()
	}
	return p.Redacted()
}

// openPG opens the database at rawURL and migrates it: the ops tables,
// and the vault's unless withoutVault.
// Every statement sent is counted in stmts.
func openPG(ctx context.Context, rawURL string, withoutVault bool, now func() time.Time, stmts *atomic.Int64) (*sql.DB, error) {
	shown := RedactURL(rawURL)
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		// pgx's message may quote the URL; say only which one, redacted.
		return nil, fmt.Errorf("store: url %s: not a valid PostgreSQL connection URL", shown)
	}
	db := sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg), stmts})
	db.SetMaxOpenConns(pgPoolSize)
	db.SetMaxIdleConns(pgPoolSize)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %s", shown, redactErr(err, rawURL))
	}
	lists := []struct {
		name, table string
		list        []migration
	}{{"ops", "schema_migrations", opsMigrations}, {"vault", "vault_schema_migrations", vaultMigrations}}
	if withoutVault {
		lists = lists[:1]
	}
	for _, l := range lists {
		if err := migrate(ctx, db, dialectPG, l.name+" schema at "+shown, l.table, l.list, now); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// redactErr is err's text with any password of rawURL removed.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	if p, perr := url.Parse(rawURL); perr == nil {
		if pw, ok := p.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		if pw := p.Query().Get("password"); pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return msg
}

// dialect is the SQL a database speaks beyond the portable subset.
type dialect int

const (
	dialectSQLite dialect = iota
	dialectPG
)

var (
	reBlob    = regexp.MustCompile(`\bBLOB\b`)
	reInteger = regexp.MustCompile(`\bINTEGER\b`)
)

// ddl adapts a migration statement: on PostgreSQL, BLOB is BYTEA and
// INTEGER (64-bit in SQLite, where times in unix milliseconds live) is
// BIGINT.
func (d dialect) ddl(stmt string) string {
	if d != dialectPG {
		return stmt
	}
	return reInteger.ReplaceAllString(reBlob.ReplaceAllString(stmt, "BYTEA"), "BIGINT")
}

// numbered rewrites ? placeholders to $1, $2, ... as PostgreSQL wants,
// leaving quoted strings and identifiers alone.
func numbered(query string) string {
	if !strings.ContainsRune(query, '?') {
		return query
	}
	var b strings.Builder
	n := 0
	var quote byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// pgConnector is pgx's database/sql connector with numbered placeholders:
// every statement through a *sql.DB or *sql.Tx from it is rebound, so the
// store's methods (and any added later) run unchanged.
type pgConnector struct {
	driver.Connector
	stmts *atomic.Int64
}

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(*stdlib.Conn)
	if !ok {
		conn.Close()
		return nil, errors.New("store: pgx connector gave an unexpected connection type")
	}
	return pgConn{sc, c.stmts}, nil
}

// pgConn forwards to pgx's connection, rebinding and counting each
// statement.
type pgConn struct {
	c     *stdlib.Conn
	stmts *atomic.Int64
}

func (p pgConn) Prepare(q string) (driver.Stmt, error) {
	p.stmts.Add(1)
	return p.c.Prepare(numbered(q))
}
func (p pgConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	p.stmts.Add(1)
	return p.c.PrepareContext(ctx, numbered(q))
}
func (p pgConn) Close() error              { return p.c.Close() }
func (p pgConn) Begin() (driver.Tx, error) { return p.c.Begin() } //nolint:staticcheck // driver.Conn requires it
func (p pgConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	return p.c.BeginTx(ctx, o)
}
func (p pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	p.stmts.Add(1)
	return p.c.ExecContext(ctx, numbered(q), args)
}
func (p pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	p.stmts.Add(1)
	return p.c.QueryContext(ctx, numbered(q), args)
}
func (p pgConn) Ping(ctx context.Context) error             { return p.c.Ping(ctx) }
func (p pgConn) CheckNamedValue(v *driver.NamedValue) error { return p.c.CheckNamedValue(v) }
func (p pgConn) ResetSession(ctx context.Context) error     { return p.c.ResetSession(ctx) }
