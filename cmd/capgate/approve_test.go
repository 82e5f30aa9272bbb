package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/store"
)

// approveSetup writes a minimal capgate.toml and opens its store as a
// server would (with the vault, under a key the CLI never sees).
func approveSetup(t *testing.T) (configPath string, st *store.Store) {
	t.Helper()
	dir := t.TempDir()
	configPath = filepath.Join(dir, "capgate.toml")
	dataDir := filepath.Join(dir, "data")
	if err := os.WriteFile(configPath, []byte(fmt.Sprintf("[server]\ndata_dir = %q\n", dataDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	st, err := store.Open(context.Background(), dataDir, store.Options{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return configPath, st
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestApprove(t *testing.T) {
	ctx := context.Background()
	cfg, st := approveSetup(t)
	hash := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	a, err := st.RequestApproval(ctx, "alice", "mcp:fs:delete_tree", hash, nil, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UseApproval(ctx, "alice", "mcp:fs:delete_tree", hash); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("use before approve: %v", err)
	}

	code, stdout, stderr := runCLI("approve", a.ID, "--config", cfg, "--by", "ops-oliver")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	want := fmt.Sprintf("approved %s for alice: mcp:fs:delete_tree (input sha256 0123456789ab…), valid until %s\ninput: (not recorded)\n",
		a.ID, a.ExpiresAt.Format(time.RFC3339))
	if stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	used, err := st.UseApproval(ctx, "alice", "mcp:fs:delete_tree", hash)
	if err != nil {
		t.Fatalf("use after capgate approve: %v", err)
	}
	if used.ID != a.ID || used.ApprovedBy != "ops-oliver" {
		t.Errorf("used %+v", used)
	}

	// Approving it again: used.
	code, _, stderr = runCLI("approve", a.ID, "--config", cfg)
	if code != 1 || !strings.Contains(stderr, "approval "+a.ID+" was already used at") {
		t.Errorf("approve after use: exit %d, stderr %q", code, stderr)
	}
}

func TestApproveRefusals(t *testing.T) {
	ctx := context.Background()
	cfg, st := approveSetup(t)
	a, err := st.RequestApproval(ctx, "alice", "mcp:fs:delete_tree", "sha256:feedface00112233", nil, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runCLI("approve", a.ID, "--config", cfg, "--by", "first"); code != 0 ||
		!strings.Contains(stdout, "(input sha256 feedface0011…)") {
		t.Fatalf("approve: exit %d %q %q", code, stdout, stderr)
	}
	tests := []struct {
		name   string
		args   []string
		exit   int
		stderr []string
	}{
		{"already approved", []string{"approve", a.ID, "--config", cfg}, 1,
			[]string{"approval " + a.ID + " was already approved by first at"}},
		{"unknown", []string{"approve", "apr_00000000000000000000000000000000", "--config", cfg}, 1,
			[]string{"approval apr_00000000000000000000000000000000 not found", "capgate approvals --config " + cfg + " lists the live ones"}},
		{"malformed id", []string{"approve", "apr-123", "--config", cfg}, 1,
			[]string{"not found", "approval ids are apr_ and 32 hex digits"}},
		{"no id", []string{"approve", "--config", cfg}, 2, []string{"accepts 1 arg(s)"}},
		{"empty by", []string{"approve", a.ID, "--config", cfg, "--by", ""}, 2, []string{"--by: say who approves"}},
		{"missing config", []string{"approve", a.ID, "--config", filepath.Join(t.TempDir(), "nope.toml")}, 2,
			[]string{"nope.toml", "no such file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tt.args...)
			if code != tt.exit {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.exit, stdout, stderr)
			}
			for _, p := range tt.stderr {
				if !strings.Contains(stderr, p) {
					t.Errorf("stderr lacks %q: %s", p, stderr)
				}
			}
		})
	}
}

func TestApproveExpired(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "capgate.toml")
	dataDir := filepath.Join(dir, "data")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[server]\ndata_dir = %q\n", dataDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	// An approval made an hour ago, for five minutes.
	past := func() time.Time { return time.Now().Add(-time.Hour) }
	st, err := store.Open(ctx, dataDir, store.Options{WithoutVault: true, Now: past})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := st.RequestApproval(ctx, "alice", "mcp:fs:delete_tree", "h", nil, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI("approve", a.ID, "--config", cfg)
	if code != 1 || !strings.Contains(stderr, "approval "+a.ID+" expired at "+a.ExpiresAt.Format(time.RFC3339)) {
		t.Errorf("approve of an expired approval: exit %d, stderr %q", code, stderr)
	}
}

func TestApprovalsList(t *testing.T) {
	ctx := context.Background()
	cfg, st := approveSetup(t)
	if code, stdout, stderr := runCLI("approvals", "--config", cfg); code != 0 || stdout != "no live approvals\n" {
		t.Errorf("empty list: exit %d %q %q", code, stdout, stderr)
	}
	pending, err := st.RequestApproval(ctx, "alice", "mcp:fs:delete_tree", "aaaaaaaaaaaaaaaa", nil, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	approved, err := st.RequestApproval(ctx, "bob", "mcp:db:drop", "bbbbbbbbbbbbbbbb", nil, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Approve(ctx, approved.ID, "ops-oliver"); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCLI("approvals", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("listing:\n%s", stdout)
	}
	for i, want := range [][]string{
		{approved.ID, "bob", "mcp:db:drop", "approved by ops-oliver", approved.ExpiresAt.Format(time.RFC3339)},
		{pending.ID, "alice", "mcp:fs:delete_tree", "pending", pending.ExpiresAt.Format(time.RFC3339)},
	} {
		for _, p := range want {
			if !strings.Contains(lines[i+1], p) {
				t.Errorf("line %q lacks %q", lines[i+1], p)
			}
		}
	}

	code, stdout, stderr = runCLI("approvals", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got []approvalJSON
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	if len(got) != 2 || got[0].ID != approved.ID || got[0].State != "approved" || got[0].ApprovedBy != "ops-oliver" ||
		got[0].ApprovedAt == nil || got[1].ID != pending.ID || got[1].State != "pending" || got[1].ApprovedAt != nil ||
		got[1].InputHash != "aaaaaaaaaaaaaaaa" || !got[1].ExpiresAt.Equal(pending.ExpiresAt) {
		t.Errorf("JSON %+v", got)
	}
}
