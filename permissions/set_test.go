package permissions

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

func TestRequired(t *testing.T) {
	tests := []struct {
		p    Primary
		t    ItemType
		id   string
		want string
	}{
		{Execute, Tool, "mcp:filesystem:read_file", "rye.execute.tool.mcp.filesystem.read_file"},
		{Execute, Tool, "ext:tools.postman:get", "rye.execute.tool.ext.tools.postman.get"},
		{Execute, Tool, "bridge:gog:email.list_messages", "rye.execute.tool.bridge.gog.email.list_messages"},
		{Fetch, Knowledge, "mcp:docs:file/a/b.md", "rye.fetch.knowledge.mcp.docs.file.a.b.md"},
		{Fetch, Directive, "", "rye.fetch.directive"},
		{Sign, Directive, "x", "rye.sign.directive.x"},
		{Execute, Tool, ":a::b//c/", "rye.execute.tool..a..b..c."},
		{Execute, Tool, "mcp:fs:é/\xff:x", "rye.execute.tool.mcp.fs.é.\xff.x"},
	}
	for _, tt := range tests {
		if got := Required(tt.p, tt.t, tt.id); got != tt.want {
			t.Errorf("Required(%s, %s, %q) = %q, want %q", tt.p, tt.t, tt.id, got, tt.want)
		}
		// Required and a directive's grants must dot an id alike.
		if tt.id != "" {
			if got, want := Required(tt.p, tt.t, tt.id), "rye."+string(tt.p)+"."+string(tt.t)+"."+dotted.Replace(tt.id); got != want {
				t.Errorf("Required(%s, %s, %q) = %q, but dotted gives %q", tt.p, tt.t, tt.id, got, want)
			}
		}
	}
	if _, err := ParsePrimary("search"); err == nil || !strings.Contains(err.Error(), "execute, fetch, sign") {
		t.Errorf("ParsePrimary(search) error = %v, want one listing the valid primaries", err)
	}
	if _, err := ParseItemType("tools"); err == nil || !strings.Contains(err.Error(), "tool, directive, knowledge") {
		t.Errorf("ParseItemType(tools) error = %v, want one listing the valid types", err)
	}
}

// TestSetMatrix checks a grant × capability matrix.
func TestSetMatrix(t *testing.T) {
	caps := []string{
		"rye.execute.tool.mcp.filesystem.read_file",
		"rye.execute.tool.mcp.filesystem.write_file",
		"rye.execute.tool.mcp.github.create_issue",
		"rye.fetch.tool.mcp.filesystem.read_file",
		"rye.execute.directive.deploy",
		"rye.fetch.directive",
	}
	tests := []struct {
		grants []string
		want   string // one letter per capability: y allowed, n denied
	}{
		{nil, "nnnnnn"},
		{[]string{"rye.*"}, "yyyyyy"},
		{[]string{"*"}, "yyyyyy"},
		{[]string{"rye.execute.*"}, "yyynyn"},
		{[]string{"rye.execute.tool.mcp.filesystem.*"}, "yynnnn"},
		{[]string{"rye/execute/tool/mcp/filesystem/*"}, "yynnnn"}, // '/' is read as '.'
		{[]string{"rye.execute.tool.mcp.filesystem.read_file"}, "ynnnnn"},
		{[]string{"rye.*.tool.mcp.filesystem.read_file"}, "ynnynn"},
		{[]string{"rye.fetch.*"}, "nnnyny"},
		{[]string{"rye.fetch.directive"}, "nnnnny"},
		{[]string{"rye.execute.tool.mcp.*.?????_file"}, "nynnnn"},
		{[]string{"rye.execute.tool.mcp.[fg]*.*"}, "yyynnn"},
		{[]string{"rye.execute.tool.mcp.[!f]*.*"}, "nnynnn"},
		{[]string{"rye.Execute.*"}, "nnnnnn"}, // case-sensitive
		{[]string{"rye.execute.tool.mcp.filesystem.read_file", "rye.fetch.*"}, "ynnyny"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.grants, ","), func(t *testing.T) {
			s, err := NewSet(tt.grants...)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range caps {
				d := s.Check(c)
				if want := tt.want[i] == 'y'; d.Allowed != want {
					t.Errorf("Check(%s) = %v, want %v (%s)", c, d.Allowed, want, d.Reason())
				}
				if d.Allowed != s.Allows(c) {
					t.Errorf("Allows(%s) disagrees with Check", c)
				}
				if d.Allowed && !Match(d.Grant(), c) {
					t.Errorf("Check(%s) names grant %s, which does not match", c, d.Grant())
				}
			}
		})
	}
}

func TestSetFailsClosed(t *testing.T) {
	var zero Set
	empty := MustSet()
	for _, s := range []*Set{nil, &zero, empty, Intersect(MustSet("rye.*"), empty), Intersect(nil, MustSet("rye.*"))} {
		d := s.Check("rye.execute.tool.x")
		if d.Allowed || s.Allows("rye.execute.tool.x") {
			t.Errorf("set %+v allowed a call", s)
		}
		if !strings.Contains(d.Reason(), "rye.execute.tool.x") {
			t.Errorf("denial %q does not name the required string", d.Reason())
		}
	}
}

func TestParseGrantErrors(t *testing.T) {
	_, err := NewSet("rye.fetch.*", "", "rye.execute.tool.a b", "rye.\x00")
	if err == nil {
		t.Fatal("NewSet accepted bad grants")
	}
	for _, want := range []string{"grant 2: empty grant", "grant 3:", "white space", "grant 4:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestCheckNamesMostSpecificGrant(t *testing.T) {
	s := MustSet("rye.*", "rye.execute.tool.mcp.*", "rye.execute.*", "rye.execute.tool.mcp.fs.read")
	if got := s.Check("rye.execute.tool.mcp.fs.read").Grant(); got != "rye.execute.tool.mcp.fs.read" {
		t.Errorf("matched %q, want the exact grant", got)
	}
	if got := s.Check("rye.execute.tool.mcp.fs.write").Grant(); got != "rye.execute.tool.mcp.*" {
		t.Errorf("matched %q, want rye.execute.tool.mcp.*", got)
	}
	if got := s.Check("rye.fetch.tool.x").Grant(); got != "rye.*" {
		t.Errorf("matched %q, want rye.*", got)
	}
}

// realisticGrants builds n grants of the shapes operators write: exact
// tools, per-server and per-pack wildcards, bridge namespaces, directives.
func realisticGrants(rng *rand.Rand, n int) []string {
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		srv := fmt.Sprintf("server%d", rng.IntN(n/4+1))
		switch rng.IntN(6) {
		case 0:
			out = append(out, fmt.Sprintf("rye.execute.tool.mcp.%s.tool_%d", srv, rng.IntN(50)))
		case 1:
			out = append(out, fmt.Sprintf("rye.execute.tool.mcp.%s.*", srv))
		case 2:
			out = append(out, fmt.Sprintf("rye.execute.tool.bridge.ns%d.cap_%d.*", rng.IntN(n/8+1), rng.IntN(20)))
		case 3:
			out = append(out, fmt.Sprintf("rye.execute.tool.ext.tools.pack%d.*", rng.IntN(n/4+1)))
		case 4:
			out = append(out, fmt.Sprintf("rye.fetch.knowledge.mcp.%s.*", srv))
		default:
			out = append(out, fmt.Sprintf("rye.execute.directive.team%d.skill_%d", rng.IntN(30), rng.IntN(30)))
		}
	}
	return out
}

// TestIndexEqualsLinearScan checks the prefix index against trying every
// grant, on random sets built from the fnmatch corpus and realistic grants.
func TestIndexEqualsLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	corpus := readCorpus(t)
	for round := range 300 {
		var grants []string
		if round%2 == 0 {
			grants = realisticGrants(rng, 1+rng.IntN(40))
		} else {
			for range 1 + rng.IntN(20) {
				p := corpus[rng.IntN(len(corpus))].Pattern
				if _, err := ParseGrant(p); err == nil {
					grants = append(grants, p)
				}
			}
		}
		s, err := NewSet(grants...)
		if err != nil {
			t.Fatal(err)
		}
		subjects := realisticGrants(rng, 20)
		for range 20 {
			subjects = append(subjects, corpus[rng.IntN(len(corpus))].S)
		}
		for _, req := range subjects {
			req = strings.ReplaceAll(req, "*", "x")
			linear := false
			for _, g := range grants {
				if Match(strings.ReplaceAll(g, "/", "."), req) {
					linear = true
					break
				}
			}
			if got := s.Allows(req); got != linear {
				t.Fatalf("grants %q, required %q: index says %v, linear scan %v", grants, req, got, linear)
			}
		}
	}
}

func TestIntersect(t *testing.T) {
	parent := MustSet("rye.execute.tool.mcp.*", "rye.fetch.*")
	child := MustSet("rye.execute.tool.mcp.filesystem.*", "rye.execute.tool.bridge.*", "rye.fetch.tool.*")
	s := Intersect(child, parent)
	tests := []struct {
		req  string
		want bool
	}{
		{"rye.execute.tool.mcp.filesystem.read", true},
		{"rye.execute.tool.mcp.github.x", false}, // parent yes, child no
		{"rye.execute.tool.bridge.gog.x", false}, // child yes, parent no: never wider
		{"rye.fetch.tool.mcp.github.x", true},    // both
		{"rye.fetch.directive.x", false},         // parent only
		{"rye.execute.directive.x", false},       // neither
	}
	for _, tt := range tests {
		d := s.Check(tt.req)
		if d.Allowed != tt.want {
			t.Errorf("%s: allowed=%v, want %v (%s)", tt.req, d.Allowed, tt.want, d.Reason())
		}
		if d.Allowed && len(d.Matched) != 2 {
			t.Errorf("%s: matched %v, want one grant per layer", tt.req, d.Matched)
		}
	}
	if r := s.Check("rye.execute.tool.bridge.gog.x").Reason(); !strings.Contains(r, "attenuation layer 2") {
		t.Errorf("reason %q does not say which layer refused", r)
	}
	// Property: the intersection allows exactly what both allow.
	rng := rand.New(rand.NewPCG(3, 5))
	for range 200 {
		a, b := MustSet(realisticGrants(rng, 10)...), MustSet(realisticGrants(rng, 10)...)
		ab := Intersect(a, b)
		for _, req := range realisticGrants(rng, 30) {
			req = strings.ReplaceAll(req, "*", "y")
			if ab.Allows(req) != (a.Allows(req) && b.Allows(req)) {
				t.Fatalf("Intersect differs from a AND b on %q", req)
			}
		}
	}
}

// Benchmark fixtures are kept in testdata so that the Python baseline
// (testdata/python_baseline.py) times the very same grants.
func benchGrants(b *testing.B, file string) (grants []string, required string) {
	b.Helper()
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		b.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[1:], strings.TrimPrefix(lines[0], "# required: ")
}

func TestBenchFixtures(t *testing.T) {
	if *update {
		rng := rand.New(rand.NewPCG(2026, 11))
		write := func(file, required string, grants []string) {
			body := "# required: " + required + "\n" + strings.Join(grants, "\n") + "\n"
			if err := os.WriteFile("testdata/"+file, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("grants1000.txt", "rye.execute.tool.mcp.server117.tool_7", realisticGrants(rng, 1000))
		write("grants100_nomatch.txt", "rye.execute.tool.mcp.server999.tool_7", realisticGrants(rng, 100))
	}
	for file, wantAllowed := range map[string]bool{"grants1000.txt": true, "grants100_nomatch.txt": false} {
		data, err := os.ReadFile("testdata/" + file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		s := MustSet(lines[1:]...)
		if got := s.Allows(strings.TrimPrefix(lines[0], "# required: ")); got != wantAllowed {
			t.Errorf("%s: allowed=%v, want %v: the benchmark would measure the wrong case", file, got, wantAllowed)
		}
	}
}

func BenchmarkCheck1000(b *testing.B) {
	grants, req := benchGrants(b, "grants1000.txt")
	s := MustSet(grants...)
	b.ReportAllocs()
	for b.Loop() {
		if !s.Allows(req) {
			b.Fatal("denied")
		}
	}
}

func BenchmarkCheckDecision1000(b *testing.B) {
	grants, req := benchGrants(b, "grants1000.txt")
	s := MustSet(grants...)
	b.ReportAllocs()
	for b.Loop() {
		if d := s.Check(req); !d.Allowed {
			b.Fatal("denied")
		}
	}
}

func BenchmarkCheck100NoMatch(b *testing.B) {
	grants, req := benchGrants(b, "grants100_nomatch.txt")
	s := MustSet(grants...)
	b.ReportAllocs()
	for b.Loop() {
		if s.Allows(req) {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkLinear100NoMatch is the naive loop over compiled patterns, for
// comparison with the index.
func BenchmarkLinear100NoMatch(b *testing.B) {
	grants, req := benchGrants(b, "grants100_nomatch.txt")
	pats := make([]*Pattern, len(grants))
	for i, g := range grants {
		pats[i] = Compile(g)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, p := range pats {
			if p.Match(req) {
				b.Fatal("allowed")
			}
		}
	}
}

func TestCheckDoesNotAllocate(t *testing.T) {
	s := MustSet(realisticGrants(rand.New(rand.NewPCG(1, 1)), 1000)...)
	if n := testing.AllocsPerRun(100, func() { s.Allows("rye.execute.tool.mcp.server3.tool_1") }); n != 0 {
		t.Errorf("Allows allocates %v times per call, want 0", n)
	}
}

// TestExplainIsCheck: Explain answers as Check does, reason included, for
// every shape of set (more layers than Explain keeps on the stack too).
func TestExplainIsCheck(t *testing.T) {
	var zero Set
	a, b := MustSet("rye.execute.tool.mcp.*", "rye.fetch.*"), MustSet("rye.execute.tool.*", "rye.fetch.tool.*")
	c := MustSet("rye.*")
	five := Intersect(Intersect(Intersect(a, b), Intersect(c, a)), b)
	sets := []*Set{nil, &zero, MustSet(), a, Intersect(a, b), Intersect(b, Intersect(c, a)), five, Intersect(MustSet(), a)}
	reqs := []string{"rye.execute.tool.mcp.fs.read", "rye.fetch.tool.mcp.fs.read", "rye.fetch.directive.x", "rye.execute.tool.bridge.gog.x", "rye.sign.x"}
	for i, s := range sets {
		for _, req := range reqs {
			d := s.Check(req)
			allowed, layer, reason := s.Explain(req)
			if allowed != d.Allowed || layer != d.Layer || reason != d.Reason() {
				t.Errorf("set %d, %s: Explain = %v, %d, %q; Check = %v, %d, %q", i, req, allowed, layer, reason, d.Allowed, d.Layer, d.Reason())
			}
		}
	}
	// The allowed reasons, word for word, as the audit log has them.
	if _, _, r := a.Explain("rye.fetch.tool.x"); r != "rye.fetch.tool.x is allowed by grant rye.fetch.*" {
		t.Errorf("one layer: reason %q", r)
	}
	if _, _, r := Intersect(b, a).Explain("rye.fetch.tool.x"); r != "rye.fetch.tool.x is allowed by grants rye.fetch.tool.* and rye.fetch.*" {
		t.Errorf("two layers: reason %q", r)
	}
	if r := (Decision{Required: "x", Allowed: true, Layers: 2}).Reason(); r != "x is allowed by grants " {
		t.Errorf("no matches: reason %q", r)
	}
	ab := Intersect(a, b)
	if n := testing.AllocsPerRun(100, func() { ab.Explain("rye.execute.tool.mcp.fs.read") }); n > 1 {
		t.Errorf("Explain allocates %v times when allowed, want only the reason", n)
	}
}
