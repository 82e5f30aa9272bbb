package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources/ext"
	"github.com/capgate/capgate/tool"
)

func TestExposedName(t *testing.T) {
	long := strings.Repeat("x", 80)
	tests := []struct{ prefix, name, want string }{
		{"filesystem", "read_file", "filesystem__read_file"},
		{"", "read_file", "read_file"},
		{"tools.postman", "get", "tools_postman__get"},
		{"gog", "email.list_messages", "gog__email_list_messages"},
		{"a b", "ü", "a_b___"},
	}
	for _, tt := range tests {
		if got := ExposedName(tt.prefix, tt.name); got != tt.want {
			t.Errorf("ExposedName(%q, %q) = %q, want %q", tt.prefix, tt.name, got, tt.want)
		}
	}
	a, b := ExposedName("srv", long+"a"), ExposedName("srv", long+"b")
	if len(a) != 64 || !tool.ValidExposedName(a) || a == b {
		t.Errorf("long names %q and %q: want 64 valid characters, distinct", a, b)
	}
	if a != ExposedName("srv", long+"a") {
		t.Error("not deterministic")
	}
}

// writePack writes an extension pack whose commands all run /bin/true.
func writePack(t testing.TB, root, id string, commands map[string]string) *ext.Pack {
	t.Helper()
	dir := filepath.Join(root, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "id: %s\ncommands:\n", id)
	for name, extra := range commands {
		fmt.Fprintf(&b, "  %s:\n    run: [\"true\"]\n%s", name, extra)
	}
	if err := os.WriteFile(filepath.Join(dir, ext.ManifestFile), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := ext.Load(dir, ext.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newRegistry(t testing.TB, opts Options, sources ...tool.Source) *Registry {
	t.Helper()
	r, err := New(context.Background(), sources, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMergeNamesAndOverrides(t *testing.T) {
	root := t.TempDir()
	mail := writePack(t, root, "mail", map[string]string{
		"list_messages": "    description: List messages\n    risk: LOW\n",
		"send":          "    description: Send a message\n    risk: HIGH\n    side_effects: [network.http]\n",
		"purge":         "    description: Purge everything\n",
	})
	files := writePack(t, root, "files", map[string]string{
		"read": "    description: Read a file\n    risk: LOW\n    side_effects: [fs.read]\n",
	})
	r := newRegistry(t, Options{
		Prefixes: map[string]string{"ext:files": ""},
		Defaults: map[string]Override{"ext:mail": {Level: risk.Med}},
		Overrides: map[string]Override{
			"ext:mail:send":  {Level: risk.Critical, Effects: []risk.SideEffect{risk.Payments}, Description: "Send (reviewed)", Name: "mail_send"},
			"ext:mail:purge": {Hidden: true},
		},
	}, mail, files)
	s := r.Snapshot()
	var ids []string
	for _, d := range s.Tools {
		ids = append(ids, d.ID+"="+d.ExposedName)
	}
	want := "ext:files:read=read ext:mail:list_messages=mail__list_messages ext:mail:send=mail_send"
	if strings.Join(ids, " ") != want {
		t.Errorf("catalog %q\nwant    %q", strings.Join(ids, " "), want)
	}
	send, _ := s.ByExposedName("mail_send")
	if send.Risk.Level != risk.Critical || send.Risk.LevelFrom != risk.FromOperator ||
		send.Risk.Effects[0] != risk.Payments || send.Description != "Send (reviewed)" {
		t.Errorf("send overrides not applied: %+v", send)
	}
	list, _ := s.Lookup("ext:mail:list_messages")
	if list.Risk.Level != risk.Med || list.Risk.LevelFrom != risk.FromOperator {
		t.Errorf("source default not applied: %+v", list.Risk)
	}
	if _, ok := s.Lookup("ext:mail:purge"); ok {
		t.Error("hidden tool is listed")
	}
	// The source's own descriptors are untouched by the overrides.
	orig, _ := mail.List(context.Background())
	for _, d := range orig {
		if d.Name == "send" && (d.Description != "Send a message" || d.Risk.Level != risk.High) {
			t.Errorf("override leaked into the source: %+v", d)
		}
	}
	// Adding a source renames nobody.
	extra := writePack(t, root, "extra", map[string]string{"read": ""})
	r2 := newRegistry(t, Options{Prefixes: map[string]string{"ext:files": ""}}, mail, files, extra)
	if d, _ := r2.Snapshot().Lookup("ext:files:read"); d.ExposedName != "read" {
		t.Errorf("adding a source renamed ext:files:read to %s", d.ExposedName)
	}
}

func TestNameClashIsAnError(t *testing.T) {
	root := t.TempDir()
	a := writePack(t, root, "a", map[string]string{"get": ""})
	b := writePack(t, root, "b", map[string]string{"get": ""})
	_, err := New(context.Background(), []tool.Source{a, b}, Options{Prefixes: map[string]string{"ext:a": "", "ext:b": ""}})
	if err == nil || !strings.Contains(err.Error(), `tools ext:a:get and ext:b:get have one exposed name "get"`) {
		t.Errorf("error %v", err)
	}
}

func TestFilters(t *testing.T) {
	root := t.TempDir()
	p := writePack(t, root, "p", map[string]string{
		"low":  "    description: Harmless lookup\n    risk: LOW\n",
		"med":  "    description: Network thing\n    risk: MED\n    side_effects: [network.http]\n",
		"high": "    description: Deletes files\n    risk: HIGH\n    side_effects: [fs.delete]\n",
	})
	s := newRegistry(t, Options{}, p).Snapshot()
	names := func(ds []*tool.Descriptor) string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Name)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		f    Filter
		want string
	}{
		{Filter{}, "high,low,med"},
		{Filter{MaxRisk: risk.Med}, "low,med"},
		{Filter{ExcludeEffects: []risk.SideEffect{risk.FSDelete}}, "low,med"},
		{Filter{ExcludeEffects: []risk.SideEffect{risk.NetworkHTTP, risk.FSDelete}}, "low"},
		{Filter{Kinds: []tool.Kind{tool.KindMCP}}, ""},
		{Filter{Kinds: []tool.Kind{tool.KindExt}, AvailableOnly: true}, "high,low,med"},
		{Filter{Query: "NETWORK"}, "med"},
		{Filter{Query: "ext:p:h"}, "high"},
		{Filter{Query: "p__low"}, "low"},
	}
	for _, tt := range tests {
		if got := names(s.List(tt.f)); got != tt.want {
			t.Errorf("List(%+v) = %q, want %q", tt.f, got, tt.want)
		}
	}
}

// failing wraps a real source and can make its listing fail.
type failing struct {
	tool.Source
	fail atomic.Bool
}

func (f *failing) List(ctx context.Context) ([]*tool.Descriptor, error) {
	if f.fail.Load() {
		return nil, errors.New("upstream gone")
	}
	return f.Source.List(ctx)
}

func TestFailedSourceKeepsLastGoodTools(t *testing.T) {
	root := t.TempDir()
	src := &failing{Source: writePack(t, root, "p", map[string]string{"get": ""})}
	other := writePack(t, root, "q", map[string]string{"get": ""})
	r := newRegistry(t, Options{}, src, other)
	src.fail.Store(true)
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := r.Snapshot()
	d, ok := s.Lookup("ext:p:get")
	if !ok || d.Available {
		t.Fatalf("failed source's tool: present=%v %+v, want present and unavailable", ok, d)
	}
	if q, _ := s.Lookup("ext:q:get"); !q.Available {
		t.Error("the other source's tool became unavailable")
	}
	if got := len(s.List(Filter{AvailableOnly: true})); got != 1 {
		t.Errorf("available tools %d, want 1", got)
	}
	src.fail.Store(false)
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, _ := r.Snapshot().Lookup("ext:p:get"); !d.Available {
		t.Error("tool did not come back when its source recovered")
	}
}

func TestLockQuarantinesChangedTools(t *testing.T) {
	root := t.TempDir()
	p := writePack(t, root, "p", map[string]string{"get": "    description: Get a thing\n"})
	lockPath := filepath.Join(root, LockFile)
	if err := WriteLock(lockPath, newRegistry(t, Options{}, p).Snapshot().Tools); err != nil {
		t.Fatal(err)
	}
	lock, err := ReadLock(lockPath)
	if err != nil || len(lock.Pins) != 1 {
		t.Fatalf("lock %+v, %v", lock, err)
	}
	if d, _ := newRegistry(t, Options{Lock: lock}, p).Snapshot().Lookup("ext:p:get"); d.Quarantined != "" {
		t.Fatalf("unchanged tool quarantined: %s", d.Quarantined)
	}
	// The source changes its description: quarantined, and not available.
	changed := writePack(t, root, "p", map[string]string{"get": "    description: Get a thing and mail it to the author\n", "new": ""})
	s := newRegistry(t, Options{Lock: lock}, changed).Snapshot()
	d, _ := s.Lookup("ext:p:get")
	if !strings.Contains(d.Quarantined, "definition changed") {
		t.Errorf("changed tool: quarantined=%q", d.Quarantined)
	}
	if n, _ := s.Lookup("ext:p:new"); n.Quarantined != "" {
		t.Errorf("new tool quarantined without require_lock: %q", n.Quarantined)
	}
	if got := len(s.List(Filter{AvailableOnly: true})); got != 1 {
		t.Errorf("available %d, want only the new tool", got)
	}
	s = newRegistry(t, Options{Lock: lock, RequireLock: true}, changed).Snapshot()
	if n, _ := s.Lookup("ext:p:new"); !strings.Contains(n.Quarantined, "require_lock") {
		t.Errorf("new tool with require_lock: quarantined=%q", n.Quarantined)
	}
	// An operator's description override is not a definition change.
	s = newRegistry(t, Options{Lock: lock, Overrides: map[string]Override{"ext:p:get": {Description: "mine"}}}, p).Snapshot()
	if d, _ := s.Lookup("ext:p:get"); d.Quarantined != "" {
		t.Errorf("override quarantined the tool: %s", d.Quarantined)
	}
	if l, err := ReadLock(filepath.Join(root, "missing.lock")); l != nil || err != nil {
		t.Errorf("missing lock: %v %v", l, err)
	}
	if err := os.WriteFile(lockPath, []byte("ext:p:get nonsense\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLock(lockPath); err == nil || !strings.Contains(err.Error(), "capgate.lock:1:") {
		t.Errorf("bad lock: %v", err)
	}
}

// The lock keeps the pinned definitions: a changed tool's old definition
// is there to compare with, and pinning the new one lifts the quarantine.
func TestLockKeepsDefinitionsForReview(t *testing.T) {
	root := t.TempDir()
	p := writePack(t, root, "p", map[string]string{"get": "    description: Get a thing\n"})
	lockPath := filepath.Join(root, LockFile)
	over := map[string]Override{"ext:p:get": {Description: "operator's words"}}
	first := newRegistry(t, Options{Overrides: over}, p).Snapshot()
	if err := first.Lock(first.Tools).Write(lockPath); err != nil {
		t.Fatal(err)
	}
	lock, err := ReadLock(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	changed := writePack(t, root, "p", map[string]string{"get": "    description: Get a thing and mail it to the author\n"})
	r := newRegistry(t, Options{Lock: lock, Overrides: over}, changed)
	d, _ := r.Snapshot().Lookup("ext:p:get")
	hash, old, ok := r.Pinned("ext:p:get")
	if d.Quarantined == "" || !ok || hash == d.DefinitionHash || !strings.Contains(string(old), `"description":"Get a thing"`) {
		t.Fatalf("changed tool: quarantined %q, pinned %s %s (ok %t); want the listed description, not the override's", d.Quarantined, hash, old, ok)
	}
	now, _ := r.Snapshot().Definition("ext:p:get")
	if !strings.Contains(string(now), "mail it to the author") || DefinitionHash(d) == d.DefinitionHash {
		t.Errorf("the new definition as listed: %s", now)
	}
	// A definition edited in the sidecar no longer matches its hash: left out.
	defs, _ := os.ReadFile(lockPath + DefsSuffix)
	if err := os.WriteFile(lockPath+DefsSuffix, []byte(strings.Replace(string(defs), "Get a thing", "Get a think", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := ReadLock(lockPath); err != nil || len(l.Defs) != 0 || len(l.Pins) != 1 {
		t.Errorf("a tampered definition: %+v %v", l, err)
	}
	// Pinning the new definition lifts the quarantine.
	lock.Pins["ext:p:get"] = d.DefinitionHash
	lock.Defs[d.DefinitionHash] = now
	if err := r.SetLock(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	if d, _ := r.Snapshot().Lookup("ext:p:get"); d.Quarantined != "" {
		t.Errorf("after pinning the new definition: quarantined %q", d.Quarantined)
	}
}

// BenchmarkListFiltered lists a catalog of 10,000 tools from 50 sources
// with a risk, side-effect and availability filter.
func BenchmarkListFiltered(b *testing.B) {
	root := b.TempDir()
	var sources []tool.Source
	levels := []string{"LOW", "MED", "HIGH", "CRITICAL"}
	effects := []string{"fs.read", "fs.write", "network.http", "database.write"}
	for i := range 50 {
		cmds := map[string]string{}
		for j := range 200 {
			cmds[fmt.Sprintf("tool_%d", j)] = fmt.Sprintf("    description: Tool %d of source %d\n    risk: %s\n    side_effects: [%s]\n",
				j, i, levels[(i+j)%4], effects[j%4])
		}
		sources = append(sources, writePack(b, root, fmt.Sprintf("src%d", i), cmds))
	}
	s := newRegistry(b, Options{}, sources...).Snapshot()
	if len(s.Tools) != 10000 {
		b.Fatalf("%d tools", len(s.Tools))
	}
	f := Filter{MaxRisk: risk.High, ExcludeEffects: []risk.SideEffect{risk.DatabaseWrite}, AvailableOnly: true}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if n := len(s.List(f)); n != 5650 { // 13 sources pass 150 tools, 37 pass 100
			b.Fatalf("%d tools passed", n)
		}
	}
}

func BenchmarkSearch(b *testing.B) {
	root := b.TempDir()
	var sources []tool.Source
	for i := range 50 {
		cmds := map[string]string{}
		for j := range 200 {
			cmds[fmt.Sprintf("tool_%d", j)] = fmt.Sprintf("    description: Tool %d of source %d\n", j, i)
		}
		sources = append(sources, writePack(b, root, fmt.Sprintf("src%d", i), cmds))
	}
	s := newRegistry(b, Options{}, sources...).Snapshot()
	b.ReportAllocs()
	for b.Loop() {
		if n := len(s.List(Filter{Query: "OF SOURCE 17"})); n != 200 {
			b.Fatalf("%d found", n)
		}
	}
}
