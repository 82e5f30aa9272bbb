package permissions

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseDirectiveMarkdown(t *testing.T) {
	src, err := os.ReadFile("testdata/directives/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseDirective("deploy.md", src)
	if err != nil {
		t.Fatal(err)
	}
	wantGrants := []string{
		"rye.execute.tool.mcp.filesystem.read_file", // '/' read as '.'
		"rye.execute.tool.bridge.gog.*",             // an item id's ':' becomes '.' too
		"rye.execute.directive.docs.*",
		"rye.fetch.*",
	}
	if !reflect.DeepEqual(p.Grants, wantGrants) {
		t.Errorf("grants = %q, want %q", p.Grants, wantGrants)
	}
	wantAcks := []Acknowledgement{
		{Tier: "elevated", Line: 18},
		{Tier: "write", Reason: "Writes the build output into the workspace.", Line: 19},
	}
	if !reflect.DeepEqual(p.Acknowledge, wantAcks) {
		t.Errorf("acknowledge = %+v, want %+v", p.Acknowledge, wantAcks)
	}
	if p.Line != 10 {
		t.Errorf("block line = %d, want 10", p.Line)
	}
}

func TestParseDirectiveShortcuts(t *testing.T) {
	tests := []struct {
		src  string
		want []string
		acks []string
	}{
		{"<permissions>*</permissions>", []string{"rye.*"}, nil},
		{"<permissions>\n  *\n  <acknowledge risk=\"unrestricted\">root orchestrator</acknowledge>\n</permissions>",
			[]string{"rye.*"}, []string{"unrestricted"}},
		{"<permissions><execute>*</execute></permissions>", []string{"rye.execute.*"}, nil},
		{"<permissions><fetch><knowledge>*</knowledge></fetch></permissions>", []string{"rye.fetch.knowledge.*"}, nil},
		{"<permissions><execute>tool.mcp.*</execute></permissions>", []string{"rye.execute.tool.mcp.*"}, nil},
		{"<permissions><sign><directive>x</directive></sign></permissions>", []string{"rye.sign.directive.x"}, nil},
		{"<permissions/>", nil, nil},
		{"<permissions></permissions>", nil, nil},
		{"text <permissions><fetch>*</fetch></permissions> more text", []string{"rye.fetch.*"}, nil},
	}
	for _, tt := range tests {
		p, err := ParseDirective("d.md", []byte(tt.src))
		if err != nil {
			t.Errorf("%q: %v", tt.src, err)
			continue
		}
		if !reflect.DeepEqual(p.Grants, tt.want) {
			t.Errorf("%q: grants %q, want %q", tt.src, p.Grants, tt.want)
		}
		if got := p.Tiers(); len(got) != len(tt.acks) || (len(got) > 0 && !reflect.DeepEqual(got, tt.acks)) {
			t.Errorf("%q: acks %q, want %q", tt.src, got, tt.acks)
		}
	}
}

func TestParseDirectiveErrors(t *testing.T) {
	tests := []struct {
		src  string
		want string
	}{
		{"no block here", "d.md: no <permissions> block"},
		{"<permissions>\n<exec>*</exec>\n</permissions>", "d.md:2: <permissions>: unknown tag <exec>; valid tags: acknowledge, execute, fetch, sign"},
		{"<permissions>\n\n<search><directive>*</directive></search></permissions>", "d.md:3: <permissions>: unknown tag <search> (Rye's former name; capgate calls it <fetch>)"},
		{"<permissions><execute>\n<tools>x</tools></execute></permissions>", "d.md:2: <execute>: unknown tag <tools>; valid tags: tool, directive, knowledge"},
		{"<permissions><execute><tool></tool></execute></permissions>", "d.md:1: <execute><tool> is empty"},
		{"<permissions><execute></execute></permissions>", "d.md:1: <execute> is empty"},
		{"<permissions><execute>x<tool>y</tool></execute></permissions>", "text \"x\" beside item tags"},
		{"<permissions>all</permissions>", "unexpected text \"all\""},
		{"<permissions><acknowledge></acknowledge></permissions>", "<acknowledge>: needs one tier name"},
		{"<permissions><acknowledge tier=\"x\"/></permissions>", "unexpected attribute tier"},
		{"<permissions><execute><tool>a b</tool></execute></permissions>", "white space"},
		{"<permissions><execute><tool>x</execute></permissions>", "d.md:1: <permissions>: element <tool> closed by </execute>"},
		{"line1\n<permissions><fetch>*</fetch>", "d.md:2: <permissions> has no </permissions>"},
		{"<permissions>*</permissions>\n<permissions>*</permissions>", "d.md:2: more than one <permissions> block (the first is on line 1)"},
		{"<permissions><execute><tool>x<b/></tool></execute></permissions>", "<tool> holds text only, not <b>"},
	}
	for _, tt := range tests {
		_, err := ParseDirective("d.md", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want it to contain %q", tt.src, err, tt.want)
		}
	}
	_, err := ParseDirective("d.md", []byte("nothing"))
	if !errors.Is(err, ErrNoPermissions) {
		t.Errorf("error %v is not ErrNoPermissions", err)
	}
}

func FuzzParseDirective(f *testing.F) {
	f.Add([]byte("<permissions><execute><tool>a.*</tool></execute><acknowledge>x</acknowledge></permissions>"))
	f.Add([]byte("<permissions>*</permissions>"))
	f.Fuzz(func(t *testing.T, src []byte) {
		p, err := ParseDirective("f", src)
		if err != nil {
			return
		}
		// Every grant it returns must compile and start with rye.
		for _, g := range p.Grants {
			if _, err := ParseGrant(g); err != nil || !strings.HasPrefix(g, "rye.") {
				t.Fatalf("grant %q from %q: %v", g, src, err)
			}
		}
	})
}
