package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestTasks: a task recorded through one store is read through another
// on the same database (replicas), as it was written, until it expires;
// an unknown or expired id is ErrNotFound, and Prune drops expired ones.
func TestTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	dir := t.TempDir()
	a, b := mustOpen(t, dir, c), mustOpen(t, dir, c)
	rec, err := a.CreateTask(ctx, "alice", "mcp:tk:slow", "up-1", "cap_1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rec.ID, "cgt_") || len(rec.ID) != 36 {
		t.Fatalf("task id %q", rec.ID)
	}
	got, err := b.Task(ctx, rec.ID)
	if err != nil || got.Sub != "alice" || got.ToolID != "mcp:tk:slow" || got.UpstreamID != "up-1" || got.RequestID != "cap_1" ||
		!got.ExpiresAt.Equal(c.Now().Add(time.Minute)) {
		t.Fatalf("read back through another store: %+v %v", got, err)
	}
	if _, err := b.Task(ctx, "cgt_unknown"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	for name, bad := range map[string]func() error{
		"no tool":     func() error { _, err := a.CreateTask(ctx, "alice", "", "up", "r", time.Minute); return err },
		"no upstream": func() error { _, err := a.CreateTask(ctx, "alice", "t", "", "r", time.Minute); return err },
		"ttl not > 0": func() error { _, err := a.CreateTask(ctx, "alice", "t", "up", "r", 0); return err },
	} {
		if bad() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c.Advance(time.Minute)
	if _, err := b.Task(ctx, rec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("expired: %v", err)
	}
	if err := a.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := a.ops.QueryRowContext(ctx, `SELECT COUNT(*) FROM tasks`).Scan(&n); err != nil || n != 0 {
		t.Errorf("after prune: %d rows, %v", n, err)
	}
}
