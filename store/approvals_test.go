package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	if _, err := s.Idempotency(ctx, "alice", "tool", "k1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("empty store: %v", err)
	}
	if err := s.PutIdempotency(ctx, "alice", "tool", "k1", "h1", []byte("first"), time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := s.Idempotency(ctx, "alice", "tool", "k1")
	if err != nil || r.InputHash != "h1" || string(r.Result) != "first" ||
		!r.CreatedAt.Equal(c.Now()) || !r.ExpiresAt.Equal(c.Now().Add(time.Hour)) {
		t.Fatalf("got %+v, %v", r, err)
	}
	// First writer wins.
	if err := s.PutIdempotency(ctx, "alice", "tool", "k1", "h2", []byte("second"), time.Hour); !errors.Is(err, ErrExists) {
		t.Errorf("second put: %v, want ErrExists", err)
	}
	if r, _ := s.Idempotency(ctx, "alice", "tool", "k1"); r == nil || string(r.Result) != "first" || r.InputHash != "h1" {
		t.Errorf("after a second put: %+v", r)
	}
	// The key is scoped to sub and tool.
	for _, k := range [][2]string{{"bob", "tool"}, {"alice", "other"}} {
		if _, err := s.Idempotency(ctx, k[0], k[1], "k1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("(%s, %s, k1): %v, want ErrNotFound", k[0], k[1], err)
		}
		if err := s.PutIdempotency(ctx, k[0], k[1], "k1", "h", []byte(k[0]), time.Hour); err != nil {
			t.Errorf("(%s, %s, k1) put: %v", k[0], k[1], err)
		}
	}
	// Expiry: not found, then replaceable.
	c.Advance(time.Hour)
	if r, err := s.Idempotency(ctx, "alice", "tool", "k1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("expired record: %+v, %v; want ErrNotFound", r, err)
	}
	if err := s.PutIdempotency(ctx, "alice", "tool", "k1", "h3", []byte("third"), time.Minute); err != nil {
		t.Errorf("put over an expired record: %v", err)
	}
	if r, _ := s.Idempotency(ctx, "alice", "tool", "k1"); r == nil || string(r.Result) != "third" {
		t.Errorf("after replacing an expired record: %+v", r)
	}
	if err := s.PutIdempotency(ctx, "alice", "tool", "k2", "h", nil, 0); err == nil {
		t.Error("zero ttl accepted")
	}
}

func TestIdempotencyRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	const writers = 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []string
	for i := range writers {
		wg.Go(func() {
			result := fmt.Sprint("writer-", i)
			err := s.PutIdempotency(ctx, "alice", "tool", "k", "h", []byte(result), time.Hour)
			if err != nil && !errors.Is(err, ErrExists) {
				t.Errorf("put: %v", err)
			}
			if err == nil {
				mu.Lock()
				winners = append(winners, result)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d writers won: %v", len(winners), winners)
	}
	if r, err := s.Idempotency(ctx, "alice", "tool", "k"); err != nil || string(r.Result) != winners[0] {
		t.Errorf("stored %+v, %v; want the winner's %s", r, err, winners[0])
	}
}

var approvalIDRe = regexp.MustCompile(`^apr_[0-9a-f]{32}$`)

func TestApprovalLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	a, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !approvalIDRe.MatchString(a.ID) || a.Approved() || !a.ExpiresAt.Equal(c.Now().Add(15*time.Minute)) {
		t.Fatalf("new approval %+v", a)
	}
	c.Advance(time.Second)
	again, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute)
	if err != nil || again.ID != a.ID || !again.ExpiresAt.Equal(a.ExpiresAt) {
		t.Errorf("second request for the same binding: %+v, %v; want %s unchanged", again, err, a.ID)
	}
	other, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash2", nil, 15*time.Minute)
	if err != nil || other.ID == a.ID {
		t.Errorf("request for another input: %+v, %v; want a new approval", other, err)
	}

	// Pending: cannot be used.
	if _, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "hash1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("use of a pending approval: %v, want ErrNotFound", err)
	}

	approved, err := s.Approve(ctx, a.ID, "ops-oliver")
	if err != nil {
		t.Fatal(err)
	}
	if !approved.Approved() || approved.ApprovedBy != "ops-oliver" || !approved.ApprovedAt.Equal(c.Now()) || approved.Sub != "alice" {
		t.Errorf("approved %+v", approved)
	}
	_, err = s.Approve(ctx, a.ID, "ops-other")
	var ae *ApprovalError
	if !errors.Is(err, ErrApprovalApproved) || !errors.Is(err, ErrApproval) || !errors.As(err, &ae) ||
		!strings.Contains(err.Error(), "already approved by ops-oliver") {
		t.Errorf("second approve: %v", err)
	}
	// While approved and unused, a retry of the call finds it.
	if again, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute); err != nil || again.ID != a.ID || !again.Approved() {
		t.Errorf("request while approved: %+v, %v", again, err)
	}

	// Bound to sub, tool and input.
	for _, b := range [][3]string{
		{"alice", "mcp:fs:delete", "hash2"}, {"alice", "mcp:fs:write", "hash1"}, {"bob", "mcp:fs:delete", "hash1"},
	} {
		if got, err := s.UseApproval(ctx, b[0], b[1], b[2]); !errors.Is(err, ErrNotFound) {
			t.Errorf("use with %v: %+v, %v; want ErrNotFound", b, got, err)
		}
	}
	used, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "hash1")
	if err != nil || used.ID != a.ID || !used.UsedAt.Equal(c.Now()) {
		t.Fatalf("use: %+v, %v", used, err)
	}
	if _, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "hash1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second use: %v, want ErrNotFound", err)
	}
	if _, err := s.Approve(ctx, a.ID, "ops-oliver"); !errors.Is(err, ErrApprovalUsed) || !strings.Contains(err.Error(), "already used") {
		t.Errorf("approve after use: %v", err)
	}
	// Used: the next call needs a new approval.
	if next, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute); err != nil || next.ID == a.ID || next.Approved() {
		t.Errorf("request after use: %+v, %v; want a new pending approval", next, err)
	}

	_, err = s.Approve(ctx, "apr_00000000000000000000000000000000", "ops-oliver")
	if !errors.Is(err, ErrApprovalNotFound) || !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not found") {
		t.Errorf("approve of an unknown id: %v", err)
	}
}

func TestApprovalExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	pending, err := s.RequestApproval(ctx, "alice", "tool", "h1", nil, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	approved, err := s.RequestApproval(ctx, "alice", "tool", "h2", nil, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Approve(ctx, approved.ID, "op"); err != nil {
		t.Fatal(err)
	}
	c.Advance(5*time.Minute + time.Second)
	_, err = s.Approve(ctx, pending.ID, "op")
	if !errors.Is(err, ErrApprovalExpired) || !strings.Contains(err.Error(), "expired at") {
		t.Errorf("approve after expiry: %v", err)
	}
	if _, err := s.UseApproval(ctx, "alice", "tool", "h2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("use of an expired approved approval: %v, want ErrNotFound", err)
	}
	if list, err := s.Approvals(ctx); err != nil || len(list) != 0 {
		t.Errorf("live approvals after expiry: %+v, %v", list, err)
	}
	// An expired one is not handed back to a new request.
	if next, err := s.RequestApproval(ctx, "alice", "tool", "h1", nil, 5*time.Minute); err != nil || next.ID == pending.ID {
		t.Errorf("request after expiry: %+v, %v", next, err)
	}
}

func TestApprovalsList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	var ids []string
	for i := range 4 {
		a, err := s.RequestApproval(ctx, "alice", "tool", fmt.Sprint("h", i), nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ID)
		c.Advance(time.Second)
	}
	if _, err := s.Approve(ctx, ids[1], "op"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Approve(ctx, ids[2], "op"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UseApproval(ctx, "alice", "tool", "h2"); err != nil {
		t.Fatal(err)
	}
	list, err := s.Approvals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range list {
		got = append(got, fmt.Sprintf("%s:%v", a.ID, a.Approved()))
	}
	want := []string{ids[3] + ":false", ids[1] + ":true", ids[0] + ":false"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Approvals = %v, want %v (newest first, used left out)", got, want)
	}
}

func TestApprovalConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), nil)
	const n = 20
	var wg sync.WaitGroup
	ids := make([]string, n)
	for i := range n {
		wg.Go(func() {
			a, err := s.RequestApproval(ctx, "alice", "tool", "h", nil, time.Hour)
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			ids[i] = a.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent requests for one binding made several approvals: %v", ids)
		}
	}
	if _, err := s.Approve(ctx, ids[0], "op"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	wins := 0
	for range n {
		wg.Go(func() {
			_, err := s.UseApproval(ctx, "alice", "tool", "h")
			if err != nil && !errors.Is(err, ErrNotFound) {
				t.Errorf("use: %v", err)
			}
			if err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d concurrent users of one approval won, want 1", wins)
	}
}

// TestTwoStores opens one data directory twice, as the server and the
// capgate approve command do, and works both at once.
func TestTwoStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	server := mustOpen(t, dir, nil)
	cli := mustOpen(t, dir, nil)

	const n = 30
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The server keeps reading and writing while the CLI approves.
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := server.Approvals(ctx); err != nil {
				t.Errorf("server reads: %v", err)
				return
			}
			if err := server.PutIdempotency(ctx, "alice", "tool", fmt.Sprint("k", i), "h", []byte("r"), time.Hour); err != nil {
				t.Errorf("server writes: %v", err)
				return
			}
			// A busy server, not a lock held for good: SQLite's locks are
			// not fair, and a writer that never pauses starves the others
			// past any busy timeout.
			time.Sleep(time.Millisecond)
		}
	})
	for i := range n {
		a, err := server.RequestApproval(ctx, "alice", "tool", fmt.Sprint("h", i), nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		list, err := cli.Approvals(ctx)
		if err != nil || len(list) == 0 || list[0].ID != a.ID {
			t.Fatalf("the CLI's store does not see the server's approval %s: %+v, %v", a.ID, list, err)
		}
		if _, err := cli.Approve(ctx, a.ID, "op"); err != nil {
			t.Fatal(err)
		}
		if _, err := server.UseApproval(ctx, "alice", "tool", fmt.Sprint("h", i)); err != nil {
			t.Fatalf("the server does not see the CLI's approval: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	// Credentials, too, are shared: the same key file serves both.
	if err := server.PutCredential(ctx, "alice", "cap", "", []byte("m")); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Credential(ctx, "alice", "cap", ""); err != nil || string(got) != "m" {
		t.Errorf("credential across stores: %q, %v", got, err)
	}
}

// TestApproveFromAnotherProcess runs the approve side in a child process
// (this test binary again) while this one holds the store open and writes.
func TestApproveFromAnotherProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx := context.Background()
	dir := t.TempDir()
	server := mustOpen(t, dir, nil)
	a, err := server.RequestApproval(ctx, "alice", "tool", "h", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := server.Approvals(ctx); err != nil {
				t.Errorf("server reads: %v", err)
				return
			}
			if err := server.PutIdempotency(ctx, "alice", "tool", fmt.Sprint("k", i), "h", nil, time.Hour); err != nil {
				t.Errorf("server writes: %v", err)
				return
			}
			time.Sleep(time.Millisecond) // see TestTwoStores
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperApprove$")
	cmd.Env = append(os.Environ(), "STORE_HELPER_DIR="+dir, "STORE_HELPER_ID="+a.ID)
	if backend == "postgres" {
		cmd.Env = append(cmd.Env, "STORE_HELPER_URL="+pgFor(t, dir).url)
	}
	out, err := cmd.CombinedOutput()
	close(stop)
	wg.Wait()
	if err != nil || !strings.Contains(string(out), "approved "+a.ID) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if _, err := server.UseApproval(ctx, "alice", "tool", "h"); err != nil {
		t.Errorf("use after the child approved: %v", err)
	}
}

// TestHelperApprove is the child of TestApproveFromAnotherProcess.
func TestHelperApprove(t *testing.T) {
	t.Parallel()
	dir, id := os.Getenv("STORE_HELPER_DIR"), os.Getenv("STORE_HELPER_ID")
	if dir == "" {
		t.Skip("helper process only")
	}
	s, err := Open(context.Background(), dir, Options{WithoutVault: true, URL: os.Getenv("STORE_HELPER_URL")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.Approve(context.Background(), id, "child")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("approved", a.ID)
}

func BenchmarkIdempotencyLookup(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	if err := s.PutIdempotency(ctx, "alice", "mcp:fs:write", "key", "h", make([]byte, 512), time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Idempotency(ctx, "alice", "mcp:fs:write", "key"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIdempotencyMiss(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Idempotency(ctx, "alice", "mcp:fs:write", "key"); !errors.Is(err, ErrNotFound) {
			b.Fatal(err)
		}
	}
}

func BenchmarkPutIdempotency(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	result := make([]byte, 512)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := s.PutIdempotency(ctx, "alice", "mcp:fs:write", fmt.Sprint("key", i), "h", result, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUseApproval times UseApproval alone; each iteration first
// requests and approves one, off the clock.
func BenchmarkUseApproval(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		a, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "h", nil, time.Hour)
		if err == nil {
			_, err = s.Approve(ctx, a.ID, "op")
		}
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "h"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUseApprovalMiss is the common case on the call path: no
// approval to use.
func BenchmarkUseApprovalMiss(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "h"); !errors.Is(err, ErrNotFound) {
			b.Fatal(err)
		}
	}
}

func BenchmarkCredential(b *testing.B) {
	ctx := context.Background()
	s := mustOpen(b, b.TempDir(), nil)
	if err := s.PutCredential(ctx, "alice", "bridge:gog:email", "work", make([]byte, 256)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Credential(ctx, "alice", "bridge:gog:email", "work"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestApprovalInput: the input is kept for the operator (cut to
// MaxApprovalInput, its size whole); ApprovalFor finds the approved one
// without using it.
func TestApprovalInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpen(t, t.TempDir(), newClock())
	a, err := s.RequestApproval(ctx, "alice", "tool", "h", []byte(`{"cmd":"ls"}`), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApprovalFor(ctx, "alice", "tool", "h"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a pending approval found: %v", err)
	}
	if _, err := s.Approve(ctx, a.ID, "ops"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, err := s.ApprovalFor(ctx, "alice", "tool", "h")
		if err != nil || got.ID != a.ID || string(got.Input) != `{"cmd":"ls"}` || got.InputSize != 12 || got.InputTruncated() {
			t.Fatalf("ApprovalFor: %+v %v", got, err)
		}
	}
	if _, err := s.UseApproval(ctx, "alice", "tool", "h"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApprovalFor(ctx, "alice", "tool", "h"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a used approval found: %v", err)
	}

	big := []byte(`{"s":"` + strings.Repeat("x", MaxApprovalInput) + `"}`)
	b, err := s.RequestApproval(ctx, "alice", "tool", "h2", big, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.Approvals(ctx)
	if err != nil || len(list) != 1 || list[0].ID != b.ID || len(list[0].Input) != MaxApprovalInput ||
		list[0].InputSize != len(big) || !list[0].InputTruncated() {
		t.Fatalf("a long input: %d listed, %+v", len(list), err)
	}
}

// TestApprovalDeny: a denied approval cannot be approved or used, a retry
// of the call finds the denial (not a new request) while it lives, and of
// an approve and a deny racing exactly one wins.
func TestApprovalDeny(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	s := mustOpen(t, t.TempDir(), c)
	a, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", []byte(`{"path":"/"}`), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Deny(ctx, a.ID, "ops-oliver", "not the root, please")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Denied() || d.Approved() || d.DeniedBy != "ops-oliver" || d.Note != "not the root, please" || !d.DeniedAt.Equal(c.Now()) {
		t.Fatalf("denied %+v", d)
	}
	if _, err := s.Approve(ctx, a.ID, "ops-other"); !errors.Is(err, ErrApprovalDenied) || !strings.Contains(err.Error(), "denied by ops-oliver") {
		t.Errorf("approve after deny: %v", err)
	}
	if _, err := s.Deny(ctx, a.ID, "ops-other", ""); !errors.Is(err, ErrApprovalDenied) {
		t.Errorf("second deny: %v", err)
	}
	if _, err := s.UseApproval(ctx, "alice", "mcp:fs:delete", "hash1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("use of a denied approval: %v, want ErrNotFound", err)
	}
	again, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute)
	if err != nil || again.ID != a.ID || !again.Denied() {
		t.Errorf("request while denied: %+v, %v; want the denial %s", again, err, a.ID)
	}
	if got, err := s.Approval(ctx, a.ID); err != nil || !got.Denied() {
		t.Errorf("Approval(%s): %+v, %v", a.ID, got, err)
	}
	if _, err := s.Approval(ctx, "apr_00000000000000000000000000000000"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Approval of an unknown id: %v", err)
	}
	// Once the denial expires, the same call asks anew.
	c.Advance(16 * time.Minute)
	next, err := s.RequestApproval(ctx, "alice", "mcp:fs:delete", "hash1", nil, 15*time.Minute)
	if err != nil || next.ID == a.ID || next.Denied() {
		t.Errorf("request after the denial expired: %+v, %v; want a new pending approval", next, err)
	}

	// Approve and deny racing: one wins, the other is told why.
	for i := range 20 {
		p, err := s.RequestApproval(ctx, "bob", "mcp:fs:delete", fmt.Sprint("race", i), nil, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { _, err := s.ApproveNote(ctx, p.ID, "ops-a", "ok"); errs <- err }()
		go func() { _, err := s.Deny(ctx, p.ID, "ops-b", "no"); errs <- err }()
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("race %d: approve/deny errors %v, %v; want exactly one to win", i, e1, e2)
		}
	}
}
