package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/router/state"
)

// Task is a task an upstream made of a call (router/state's).
type Task = state.Task

// CreateTask records that an upstream's task upstreamID, made by a call of
// toolID for sub (invocation requestID), is sub's, under a new id that
// lives for ttl. The row is written before the caller learns the id, so
// that a tasks/get on any replica finds it (SEP-2663: a task is durably
// created before it is returned).
func (s *Store) CreateTask(ctx context.Context, sub, toolID, upstreamID, requestID string, ttl time.Duration) (*Task, error) {
	if toolID == "" || upstreamID == "" {
		return nil, errors.New("store: create task: empty tool or upstream id")
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("store: create task: ttl %s is not positive", ttl)
	}
	now := s.nowMS()
	t := &Task{ID: newID("cgt_"), Sub: sub, ToolID: toolID, UpstreamID: upstreamID, RequestID: requestID,
		CreatedAt: time.UnixMilli(now), ExpiresAt: time.UnixMilli(now + ttl.Milliseconds())}
	_, err := s.ops.ExecContext(ctx, `INSERT INTO tasks (id, sub, tool_id, upstream_id, request_id, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Sub, t.ToolID, t.UpstreamID, t.RequestID, now, ms(t.ExpiresAt))
	if err != nil {
		return nil, fmt.Errorf("store: create task: %w", err)
	}
	return t, nil
}

// Task returns the live task id, or ErrNotFound (unknown or expired).
// Whose it is, the caller checks.
func (s *Store) Task(ctx context.Context, id string) (*Task, error) {
	t := &Task{ID: id}
	var created, expires int64
	err := s.ops.QueryRowContext(ctx, `SELECT sub, tool_id, upstream_id, request_id, created_at, expires_at
		FROM tasks WHERE id = ? AND expires_at > ?`, id, s.nowMS()).
		Scan(&t.Sub, &t.ToolID, &t.UpstreamID, &t.RequestID, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: task: %w", err)
	}
	t.CreatedAt, t.ExpiresAt = time.UnixMilli(created), time.UnixMilli(expires)
	return t, nil
}
