package registry

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// server is a source of one tool whose process starts as launch.
type server struct{ launch sandbox.Launch }

func (s server) ID() string      { return "files" }
func (s server) Kind() tool.Kind { return tool.KindMCP }
func (s server) List(context.Context) ([]*tool.Descriptor, error) {
	return []*tool.Descriptor{{ID: "mcp:files:read", Kind: tool.KindMCP, Source: "files", Name: "read",
		Description: "Read a file", Available: true, Launch: s.launch.JSON()}}, nil
}
func (s server) Call(context.Context, tool.Call) (*tool.Result, error) {
	return tool.TextResult("ok"), nil
}

// TestLaunchPins: a pinned launch quarantines its tool when it loosens and
// only when it loosens; a pin written before launches were pinned (none,
// or an extension command's digest) still holds, with a note to re-lock.
func TestLaunchPins(t *testing.T) {
	base := sandbox.Launch{Run: []string{"/usr/bin/srv"}, Program: "aa", Declared: sandbox.Declared{Network: "none"}}
	with := func(f func(*sandbox.Launch)) sandbox.Launch {
		l := base
		f(&l)
		return l
	}
	pinned := newRegistry(t, Options{}, server{base}).Snapshot()
	lock := pinned.Lock(pinned.Tools)
	judged := func(l *Lock, now sandbox.Launch) string {
		t.Helper()
		d, _ := newRegistry(t, Options{Lock: l, RequireLock: true}, server{now}).Snapshot().Lookup("mcp:files:read")
		return d.Quarantined
	}
	for name, tt := range map[string]struct {
		now  sandbox.Launch
		want string // "" runs
	}{
		"unchanged":       {base, ""},
		"tighter":         {with(func(l *sandbox.Launch) { l.Declared.Filesystem = "read" }), ""},
		"network dropped": {with(func(l *sandbox.Launch) { l.Declared.Network = "" }), "no_network dropped"},
		"new program":     {with(func(l *sandbox.Launch) { l.Program = "bb" }), "program sha256 aa → bb"},
		"new args":        {with(func(l *sandbox.Launch) { l.Run = append(l.Run, "--all") }), "run "},
		"secret added":    {with(func(l *sandbox.Launch) { l.Declared.Secrets = []string{"KEY"} }), "secret KEY allowed"},
	} {
		if got := judged(lock, tt.now); (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: quarantined %q, want %q", name, got, tt.want)
		}
	}
	// Read paths widen only within the pinned ones.
	reader := with(func(l *sandbox.Launch) { l.Declared.Filesystem, l.Declared.ReadPaths = "read", []string{"/srv/data"} })
	s := newRegistry(t, Options{}, server{reader}).Snapshot()
	rl := s.Lock(s.Tools)
	if got := judged(rl, with(func(l *sandbox.Launch) { l.Declared.Filesystem, l.Declared.ReadPaths = "read", []string{"/srv/data/a"} })); got != "" {
		t.Errorf("a narrower read path quarantined: %s", got)
	}
	if got := judged(rl, with(func(l *sandbox.Launch) {
		l.Declared.Filesystem, l.Declared.ReadPaths = "read", []string{"/etc/ssl", "/srv/data"}
	})); !strings.Contains(got, "read_paths /etc/ssl added") {
		t.Errorf("a wider read path: quarantined %q", got)
	}

	// Without the pinned definitions, a change cannot be judged: it is
	// quarantined whole.
	bare := &Lock{Pins: lock.Pins}
	if got := judged(bare, with(func(l *sandbox.Launch) { l.Declared.Filesystem = "read" })); !strings.Contains(got, "definition changed") {
		t.Errorf("a change with no pinned definition to compare: quarantined %q", got)
	}
	// Pins from before launches: none at all (an MCP server's), or the
	// digest an extension command had.
	def := pinned.Tools[0]
	for name, old := range map[string]json.RawMessage{"no launch": nil, "digest": json.RawMessage(`"` + base.Digest() + `"`)} {
		d := def.Clone()
		d.Launch = old
		legacy := &Lock{Pins: map[string]string{d.ID: DefinitionHash(d)}}
		if got := judged(legacy, base); got != "" {
			t.Errorf("%s: a pin from before launch pins quarantined its unchanged tool: %s", name, got)
		}
		d.Description = "Read a file and mail it"
		legacy = &Lock{Pins: map[string]string{d.ID: DefinitionHash(d)}}
		if got := judged(legacy, base); !strings.Contains(got, "definition changed") {
			t.Errorf("%s: a changed tool under an old pin: quarantined %q", name, got)
		}
	}
}

// TestRefuses: before a server starts, the lock refuses it only when its
// launch loosens one pinned for its tools, and then gives back those tools
// from the pinned definitions, which the registry lists quarantined.
func TestRefuses(t *testing.T) {
	base := sandbox.Launch{Run: []string{"/usr/bin/srv"}, Program: "aa", Declared: sandbox.Declared{Network: "none"}}
	s := newRegistry(t, Options{}, server{base}).Snapshot()
	lock := s.Lock(s.Tools)
	tighter, looser := base, base
	tighter.Declared.Subprocess = "none"
	looser.Declared.Network = ""
	for name, now := range map[string]sandbox.Launch{"unchanged": base, "tighter": tighter} {
		if tools, changes := lock.Refuses(tool.KindMCP, "files", now.JSON()); tools != nil || changes != nil {
			t.Errorf("%s: refused (%v)", name, changes)
		}
	}
	if tools, _ := lock.Refuses(tool.KindMCP, "other", looser.JSON()); tools != nil {
		t.Errorf("refused a source the lock pins nothing of")
	}
	if tools, _ := (&Lock{Pins: lock.Pins}).Refuses(tool.KindMCP, "files", looser.JSON()); tools != nil {
		t.Errorf("refused with no pinned definition to compare with")
	}
	tools, changes := lock.Refuses(tool.KindMCP, "files", looser.JSON())
	if len(tools) != 1 || tools[0].ID != "mcp:files:read" || tools[0].Description != "Read a file" || !slices.Contains(changes, "no_network dropped") {
		t.Fatalf("refused a looser launch as %v, %v", tools, changes)
	}
	d, _ := newRegistry(t, Options{Lock: lock}, fixed{tools: tools}).Snapshot().Lookup("mcp:files:read")
	if !strings.Contains(d.Quarantined, "no_network dropped") {
		t.Errorf("the refused tool is listed as %+v", d)
	}
}

// fixed is server "files" listing tools as given.
type fixed struct {
	server
	tools []*tool.Descriptor
}

func (f fixed) List(context.Context) ([]*tool.Descriptor, error) { return f.tools, nil }

// TestPinsBeforeFileDigests: a launch pinned whole before capgate digested
// the files a run names still holds (found by its hash, no sidecar needed);
// its tool runs, with a note naming the files the pin does not vouch for,
// and without one when its run names none.
func TestPinsBeforeFileDigests(t *testing.T) {
	for name, files := range map[string]map[string]string{"script": {"server.py": "ab"}, "none": {}} {
		now := sandbox.Launch{Run: []string{"/usr/bin/python3", "server.py"}, Program: "aa", Files: files}
		r := newRegistry(t, Options{}, server{now})
		d := r.Snapshot().Tools[0].Clone()
		d.Launch = now.V1()
		lock := &Lock{Pins: map[string]string{d.ID: DefinitionHash(d)}}
		s := newRegistry(t, Options{Lock: lock, RequireLock: true}, server{now}).Snapshot()
		got, _ := s.Lookup(d.ID)
		note := s.OutdatedPin(d.ID)
		switch {
		case got.Quarantined != "":
			t.Errorf("%s: quarantined under its old pin: %s", name, got.Quarantined)
		case name == "script" && !strings.Contains(note, "before it digested the files its run names (server.py)"):
			t.Errorf("%s: note %q", name, note)
		case name == "none" && note != "":
			t.Errorf("%s: a note though the run names no file: %q", name, note)
		}
	}
}
