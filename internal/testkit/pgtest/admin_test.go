package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestDatabaseAfterConnectionsEnd: Database creates databases on one
// connection, and goes on creating them after a test ended it (as one
// that ends every connection of the server does).
func TestDatabaseAfterConnectionsEnd(t *testing.T) {
	s := NewServer(t)
	first := s.Database(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ended int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = 'postgres' AND pid <> pg_backend_pid()) t`).Scan(&ended); err != nil || ended != 1 {
		t.Fatalf("ended %d connections to database postgres (%v), want Database's one", ended, err)
	}
	second, err := pgx.Connect(ctx, s.Database(t))
	if err != nil {
		t.Fatalf("the database created after its connection ended: %v", err)
	}
	second.Close(ctx)
}
