package console

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/tool"
)

// TestVendored: the embedded scripts are the npm releases VENDOR.md names.
func TestVendored(t *testing.T) {
	table, err := os.ReadFile("static/VENDOR.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile(`(?m)^\| (\S+) \| \S+ .*\| ([0-9a-f]{64}) \|$`).FindAllStringSubmatch(string(table), -1)
	if len(rows) != 2 {
		t.Fatalf("VENDOR.md lists %d files, want 2", len(rows))
	}
	for _, r := range rows {
		b, err := assets.ReadFile("static/" + r[1])
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != r[2] {
			t.Errorf("static/%s: sha256 %x, VENDOR.md says %s", r[1], sum, r[2])
		}
	}
}

func TestRoles(t *testing.T) {
	rs := Roles{Approvers: []string{"alice", "groups=ops"}, Viewers: []string{"victor", "email=v@example.com"}}
	for _, c := range []struct {
		sub    string
		claims map[string]any
		want   role
	}{
		{"alice", nil, approver},
		{"bob", map[string]any{"groups": []any{"dev", "ops"}}, approver},
		{"bob", map[string]any{"groups": "ops"}, approver},
		{"bob", map[string]any{"groups": []any{"dev"}}, nobody},
		{"victor", nil, viewer},
		{"vera", map[string]any{"email": "v@example.com"}, viewer},
		{"", map[string]any{"groups": "ops"}, nobody}, // no subject, no role
		{"groups=ops", nil, nobody},                   // a subject is not a claim
		{"mallory", nil, nobody},
	} {
		if got := rs.of(c.sub, c.claims); got != c.want {
			t.Errorf("role of %q %v = %v, want %v", c.sub, c.claims, got, c.want)
		}
	}
}

// onceSet is ClaimOnce over a map, as the store does it (the store's own
// tests cover it across replicas).
type onceSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (o *onceSet) claim(_ context.Context, key string, _ time.Time) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[key] {
		return errors.New("exists")
	}
	o.seen[key] = true
	return nil
}

// TestSignInLink: a link signs in once, before it expires, only with the
// key it was made with, and its payload cannot be altered.
func TestSignInLink(t *testing.T) {
	key := []byte("capgate-master-key-for-tests-0123")
	now := time.Now()
	once := &onceSet{seen: map[string]bool{}}
	c, err := New(Options{Key: key, ClaimOnce: once.claim, Now: func() time.Time { return now },
		Catalog: func() []*tool.Descriptor { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tok, err := SignInLink(key, "alice", now)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := SignInLink([]byte("another-key-entirely-0000000000000"), "alice", now)
	p, sig, _ := strings.Cut(tok, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(p)
	forged := base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"alice"`, `"mallory"`, 1))) + "." + sig
	for name, bad := range map[string]string{"other key": other, "altered": forged, "empty": "", "no signature": p} {
		if _, err := c.takeLink(ctx, bad); err != errLink {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
	if sub, err := c.takeLink(ctx, tok); err != nil || sub != "alice" {
		t.Fatalf("first use: %q, %v", sub, err)
	}
	if _, err := c.takeLink(ctx, tok); err != errLink {
		t.Errorf("second use: %v, want refused", err)
	}
	late, _ := SignInLink(key, "alice", now.Add(-LinkTTL))
	if _, err := c.takeLink(ctx, late); err != errLink {
		t.Errorf("expired link: %v, want refused", err)
	}
	if _, err := SignInLink(key, "", now); err == nil {
		t.Error("a link for no subject was made")
	}
}

// writeAudit writes n records through a real audit log and returns its path.
func writeAudit(tb testing.TB, n int) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "audit.jsonl")
	l, err := audit.Open(path, audit.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now().Add(-time.Duration(n) * time.Millisecond)
	for i := range n {
		e := audit.Event{Type: audit.TypeToolCall, Sub: fmt.Sprintf("user%d", i%50), Tool: fmt.Sprintf("mcp:fs:tool%d", i%20),
			Decision: "allow", Time: start.Add(time.Duration(i) * time.Millisecond), Duration: time.Millisecond}
		if i%7 == 0 {
			e.Decision, e.Gate, e.Code = "deny", "capability", "capability_access_denied"
		}
		l.Log(e)
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	return path
}

func TestAuditIndex(t *testing.T) {
	path := writeAudit(t, 1000)
	x := newAuditIndex(path)
	recs, total, err := x.query(auditFilter{Sub: "user3", Decision: "deny"}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	// i%50 == 3 and i%7 == 0: i = 3 + 50k with (3+50k)%7 == 0.
	want := 0
	for i := range 1000 {
		if i%50 == 3 && i%7 == 0 {
			want++
		}
	}
	if total != 1000 || len(recs) != want {
		t.Fatalf("total %d, matches %d; want 1000, %d", total, len(recs), want)
	}
	if !slices.IsSortedFunc(recs, func(a, b auditRec) int { return int(b.Seq) - int(a.Seq) }) {
		t.Error("records not newest first")
	}
	line, err := x.line(recs[0].Seq)
	if err != nil || !strings.Contains(string(line), `"sub":"user3"`) {
		t.Fatalf("line %d: %s, %v", recs[0].Seq, line, err)
	}
	// Paging: before the oldest shown.
	older, _, _ := x.query(auditFilter{Before: 500}, 10)
	if len(older) != 10 || older[0].Seq != 499 {
		t.Errorf("before 500: %d records from %d", len(older), older[0].Seq)
	}
	// Appended records are indexed; a file replaced (rotation) is indexed anew.
	l, err := audit.Open(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Log(audit.Event{Type: audit.TypeOperator, Sub: "ops", Decision: "approve"})
	l.Close()
	if recs, total, _ := x.query(auditFilter{Type: audit.TypeOperator}, 10); total != 1001 || len(recs) != 1 {
		t.Errorf("after an append: total %d, operator records %d", total, len(recs))
	}
	os.Rename(path, path+".1")
	l, _ = audit.Open(path, audit.Options{})
	l.Log(audit.Event{Type: audit.TypeOperator, Sub: "ops", Decision: "deny"})
	l.Close()
	if recs, total, _ := x.query(auditFilter{}, 10); total != 1 || len(recs) != 1 || recs[0].Decision != "deny" {
		t.Errorf("after a rotation: total %d, %+v", total, recs)
	}
}

// signedIn returns the console's session cookie for sub.
func signedIn(c *Console, sub string) *http.Cookie {
	rec := httptest.NewRecorder()
	c.startSession(rec, sub, nil)
	return rec.Result().Cookies()[0]
}

// BenchmarkAuditPage renders the audit page (the newest 100 of 100,000
// records, then filtered by subject and decision) and reports its p95.
func BenchmarkAuditPage(b *testing.B) {
	path := writeAudit(b, 100_000)
	c, err := New(Options{Key: []byte("bench-key-0123456789abcdef0123456"), AuditPath: path,
		Roles: Roles{Viewers: []string{"v"}}, Catalog: func() []*tool.Descriptor { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	ck := signedIn(c, "v")
	for _, q := range []string{"", "?sub=user7&decision=deny"} {
		b.Run("q="+q, func(b *testing.B) {
			// The first request builds the index from the log.
			req := httptest.NewRequest("GET", "/audit"+q, nil)
			req.AddCookie(ck)
			rec := httptest.NewRecorder()
			c.ServeHTTP(rec, req)
			if rec.Code != 200 || !strings.Contains(rec.Body.String(), "100000 records") {
				b.Fatalf("%d %s", rec.Code, bufio.NewScanner(rec.Body).Text())
			}
			var times []time.Duration
			for b.Loop() {
				start := time.Now()
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, req)
				times = append(times, time.Since(start))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)*95/100].Microseconds())/1000, "p95-ms")
		})
	}
}

// A quarantined tool's review: each changed field as a line diff, the
// fields that did not change named; with nothing pinned, all is new.
func TestReviewOfDefinitions(t *testing.T) {
	old := json.RawMessage(`{"name":"resize","description":"Resize a volume","input_schema":{"type":"object","properties":{"volume":{"type":"string"}}},"annotations":{}}`)
	now := json.RawMessage(`{"name":"resize","description":"Resize a volume, and mail it","input_schema":{"type":"object","properties":{"cc":{"type":"string"},"volume":{"type":"string"}}},"annotations":{}}`)
	rv := reviewOf("ext:ops:resize", old, now, "sha256:new")
	if rv.NoPinned || len(rv.Fields) != 2 || rv.Fields[0].Field != "description" || rv.Fields[1].Field != "input_schema" ||
		!slices.Equal(rv.Unchanged, []string{"name", "annotations"}) {
		t.Fatalf("review %+v", rv)
	}
	if d := rv.Fields[0].Lines; len(d) != 2 || d[0] != (diffLine{"-", "Resize a volume"}) || d[1] != (diffLine{"+", "Resize a volume, and mail it"}) {
		t.Errorf("description diff %+v", d)
	}
	var added []string
	for _, l := range rv.Fields[1].Lines {
		if l.Op != " " {
			added = append(added, l.Op+l.Text)
		}
	}
	if !slices.Equal(added, []string{`+    "cc": {`, `+      "type": "string"`, `+    },`}) {
		t.Errorf("schema diff: changed lines %q", added)
	}
	if rv := reviewOf("x", nil, now, "h"); !rv.NoPinned || len(rv.Fields) != 4 {
		t.Errorf("nothing pinned: %+v", rv)
	}
}

// queue is a fixed list of approvals.
type queue struct{ list []Approval }

func (q *queue) Live(context.Context) ([]Approval, error)              { return q.list, nil }
func (q *queue) Approve(context.Context, string, string, string) error { return nil }
func (q *queue) Deny(context.Context, string, string, string) error    { return nil }

// TestQueueListUnchanged: the approvals list answers 204, which htmx does
// not swap, when the page already shows the queue (the fingerprint the
// list carries and htmx sends back), and the list, with its new
// fingerprint, once the queue changed. TestConsoleBrowser shows htmx
// keeping the page's nodes.
func TestQueueListUnchanged(t *testing.T) {
	now := time.Now()
	q := &queue{list: []Approval{{ID: "apr_1", Sub: "bob", ToolID: "ext:ops:wipe", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}}}
	c, err := New(Options{Key: []byte("capgate-master-key-for-tests-0123"), Approvals: q,
		Catalog: func() []*tool.Descriptor { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	v := &visitor{session: &session{Sub: "alice", CSRF: "c"}, Role: approver}
	shownRE := regexp.MustCompile(`id="queue-shown" name="shown" value="([0-9a-f]+)"`)
	list := func(shown string) (int, string) {
		t.Helper()
		r := httptest.NewRequest("GET", "/approvals/list?shown="+shown, nil)
		w := httptest.NewRecorder()
		c.approvalsList(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, v)))
		if w.Code != http.StatusOK {
			return w.Code, w.Body.String()
		}
		m := shownRE.FindStringSubmatch(w.Body.String())
		if m == nil || !strings.Contains(w.Body.String(), `id="apr-apr_1"`) {
			t.Fatalf("the list lacks its fingerprint or the approval:\n%s", w.Body)
		}
		return w.Code, m[1]
	}
	code, fp := list("")
	if code != http.StatusOK {
		t.Fatalf("the list with nothing shown: %d", code)
	}
	if code, body := list(fp); code != http.StatusNoContent || body != "" {
		t.Errorf("the list already shown: %d %q, want 204 and no body", code, body)
	}
	q.list[0].Approved, q.list[0].ApprovedBy = true, "alice"
	if code, now := list(fp); code != http.StatusOK || now == fp {
		t.Errorf("the list after a decision: %d, fingerprint %s (was %s); want 200 and a new one", code, now, fp)
	}
}

// TestStaticRevalidated: the embedded scripts carry an ETag of their
// content and no-cache (not the pages' no-store), so a browser asks again,
// gets 304 and reuses what it compiled; another content, another tag.
func TestStaticRevalidated(t *testing.T) {
	c, err := New(Options{Key: []byte("capgate-master-key-for-tests-0123"), Catalog: func() []*tool.Descriptor { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, tag string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if tag != "" {
			r.Header.Set("If-None-Match", tag)
		}
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		return w
	}
	first := get("/static/htmx.min.js", "")
	tag := first.Header().Get("ETag")
	if first.Code != http.StatusOK || tag == "" || first.Header().Get("Cache-Control") != "no-cache" || first.Body.Len() < 10000 {
		t.Fatalf("htmx.min.js: %d, ETag %q, Cache-Control %q, %d bytes", first.Code, tag, first.Header().Get("Cache-Control"), first.Body.Len())
	}
	if again := get("/static/htmx.min.js", tag); again.Code != http.StatusNotModified || again.Body.Len() != 0 {
		t.Errorf("htmx.min.js with its ETag: %d, %d bytes; want 304, none", again.Code, again.Body.Len())
	}
	if other := get("/static/htmx-ext-sse.js", tag); other.Code != http.StatusOK || other.Header().Get("ETag") == tag {
		t.Errorf("htmx-ext-sse.js with htmx's ETag: %d, ETag %q", other.Code, other.Header().Get("ETag"))
	}
	if page := get("/signin", ""); page.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("sign-in page: Cache-Control %q, want no-store", page.Header().Get("Cache-Control"))
	}
}
