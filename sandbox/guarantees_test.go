package sandbox

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestDerive(t *testing.T) {
	cases := []struct {
		name    string
		decl    Declared
		over    Overrides
		trust   Declared
		want    map[Key]Source
		secrets []string
		notes   []string
	}{
		{name: "undeclared guarantees nothing", want: map[Key]Source{}, secrets: nil},
		{name: "pure guarantees everything", decl: Declared{Pure: true, Secrets: []string{"K"}},
			want: map[Key]Source{NoFilesystemWrite: FromDeclaration, NoFilesystemRead: FromDeclaration, NoNetwork: FromDeclaration,
				NoSubprocess: FromDeclaration, NoEnvRead: FromDeclaration, NoEnvWrite: FromDeclaration}},
		{name: "declaration maps each key",
			decl:    Declared{Filesystem: "read", Network: "none", Env: "read", Subprocess: "none", Secrets: []string{"B", "A", "A"}},
			want:    map[Key]Source{NoFilesystemWrite: FromDeclaration, NoNetwork: FromDeclaration, NoSubprocess: FromDeclaration, NoEnvWrite: FromDeclaration},
			secrets: []string{"A", "B"}},
		{name: "filesystem none and env none",
			decl: Declared{Filesystem: "none", Env: "none", Network: "outbound", Subprocess: "allow"},
			want: map[Key]Source{NoFilesystemWrite: FromDeclaration, NoFilesystemRead: FromDeclaration, NoEnvRead: FromDeclaration, NoEnvWrite: FromDeclaration}},
		{name: "a pack's declaration adds to the command's, from pack, and is not loosened by it",
			decl: Declared{Network: "outbound", Filesystem: "read", Pack: &Declared{Network: "none", Filesystem: "none"}},
			want: map[Key]Source{NoNetwork: FromPack, NoFilesystemRead: FromPack, NoFilesystemWrite: FromDeclaration}},
		{name: "override tightens",
			decl: Declared{Network: "outbound", Filesystem: "write"},
			over: Overrides{Set: map[Key]bool{NoNetwork: true, NoFilesystemWrite: true}},
			want: map[Key]Source{NoNetwork: FromOverride, NoFilesystemWrite: FromOverride}},
		{name: "override cannot loosen and says so",
			decl:  Declared{Network: "none"},
			over:  Overrides{Set: map[Key]bool{NoNetwork: false, NoSubprocess: false}},
			want:  map[Key]Source{NoNetwork: FromDeclaration},
			notes: []string{"no_network = false would loosen a guarantee set by tool; ignored"}},
		{name: "override keeps the earlier source of a key already set",
			decl: Declared{Network: "none"},
			over: Overrides{Set: map[Key]bool{NoNetwork: true}},
			want: map[Key]Source{NoNetwork: FromDeclaration}},
		{name: "override narrows secrets, cannot add one",
			decl:    Declared{Secrets: []string{"A", "B"}},
			over:    Overrides{SecretsSet: true, SecretsAllowed: []string{"B", "C"}},
			want:    map[Key]Source{},
			secrets: []string{"B"},
			notes:   []string{`secrets_allowed: "C" is not allowed by tool; ignored`}},
		{name: "trust caps",
			decl:  Declared{Network: "outbound", Filesystem: "write", Subprocess: "allow", Secrets: []string{"A", "B"}},
			trust: Declared{Network: "none", Filesystem: "read", Secrets: []string{"A"}},
			want:  map[Key]Source{NoNetwork: FromTrust, NoFilesystemWrite: FromTrust}, secrets: []string{"A"}},
		{name: "trust never expands",
			decl:  Declared{Network: "none", Filesystem: "none", Subprocess: "none"},
			trust: Declared{Network: "outbound", Filesystem: "write", Subprocess: "allow", Secrets: []string{"X"}},
			want:  map[Key]Source{NoNetwork: FromDeclaration, NoFilesystemRead: FromDeclaration, NoFilesystemWrite: FromDeclaration, NoSubprocess: FromDeclaration}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, notes := Derive(c.decl, c.over, c.trust)
			got := map[Key]Source{}
			for k, on := range g.Set {
				if on {
					got[k] = g.From[k]
				}
			}
			if !maps.Equal(got, c.want) {
				t.Errorf("guarantees = %v, want %v", got, c.want)
			}
			if len(g.SecretsAllowed) != 0 || len(c.secrets) != 0 {
				if !slices.Equal(g.SecretsAllowed, c.secrets) {
					t.Errorf("secrets = %q, want %q", g.SecretsAllowed, c.secrets)
				}
			}
			if !slices.Equal(notes, c.notes) {
				t.Errorf("notes = %q, want %q", notes, c.notes)
			}
		})
	}
}

func TestParseDeclared(t *testing.T) {
	d, err := ParseDeclared(map[string]any{"filesystem": "read", "network": "none", "env": "none", "subprocess": "allow", "secrets": []any{"API_KEY"}}, "x.yaml: commands.get.capabilities")
	if err != nil {
		t.Fatal(err)
	}
	want := Declared{Filesystem: "read", Network: "none", Env: "none", Subprocess: "allow", Secrets: []string{"API_KEY"}}
	if d.Filesystem != want.Filesystem || d.Network != want.Network || d.Env != want.Env || d.Subprocess != want.Subprocess || !slices.Equal(d.Secrets, want.Secrets) {
		t.Errorf("got %+v, want %+v", d, want)
	}
	bad := []struct {
		in   map[string]any
		want string
	}{
		{map[string]any{"network": "inbound"}, `caps.network: "inbound" is not one of none|outbound`},
		{map[string]any{"filesystem": 1}, `caps.filesystem: want a string (one of none|read|write), got int`},
		{map[string]any{"gpu": "none"}, `caps: unknown key "gpu"`},
		{map[string]any{"secrets": "A"}, `caps.secrets: want a list of names, got string`},
		{map[string]any{"secrets": []any{"A", 2}}, `caps.secrets[1]: want a name, got int`},
		{map[string]any{"secrets": []any{"A-B"}}, `caps.secrets[0]: "A-B" is not a variable name`},
		{map[string]any{"env": "write"}, `caps.env: "write" is not one of none|read`},
		{map[string]any{"subprocess": "some"}, `caps.subprocess: "some" is not one of none|allow`},
		{map[string]any{"filesystem": "read", "read_paths": []any{"data"}}, `caps.read_paths[0]: want an absolute path, got data`},
		{map[string]any{"filesystem": "read", "read_paths": "/srv"}, `caps.read_paths: want a list of absolute paths, got string`},
		{map[string]any{"filesystem": "none", "read_paths": []any{"/srv"}}, `caps.read_paths: needs filesystem: read`},
		{map[string]any{"read_paths": []any{"/srv"}}, `filesystem is undeclared`},
		{map[string]any{"filesystem": "read", "write_paths": []any{"/srv"}}, `caps.write_paths: needs filesystem: write`},
	}
	for _, b := range bad {
		_, err := ParseDeclared(b.in, "caps")
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseDeclared(%v) = %v, want error containing %q", b.in, err, b.want)
		}
	}
}

func TestParseOverrides(t *testing.T) {
	o, err := ParseOverrides(map[string]any{"no_network": true, "no_subprocess": false, "secrets_allowed": []any{"A"}, "allow_unsafe_execution": true}, `capgate.toml: capability_overrides."ext:x:y"`)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(o.Set, map[Key]bool{NoNetwork: true, NoSubprocess: false}) || !o.SecretsSet || !slices.Equal(o.SecretsAllowed, []string{"A"}) || !o.AllowUnsafe {
		t.Errorf("got %+v", o)
	}
	bad := []struct {
		in   map[string]any
		want string
	}{
		{map[string]any{"no_network": "yes"}, `ov.no_network: want true or false, got string`},
		{map[string]any{"network": "none"}, `ov: unknown key "network"`},
		{map[string]any{"secrets_allowed": "A"}, `ov.secrets_allowed: want a list of names, got string`},
		{map[string]any{"secrets_allowed": []any{"A B"}}, `ov.secrets_allowed[0]: want a variable name, got A B`},
		{map[string]any{"allow_unsafe_execution": 1}, `ov.allow_unsafe_execution: want true or false, got int`},
	}
	for _, b := range bad {
		_, err := ParseOverrides(b.in, "ov")
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseOverrides(%v) = %v, want error containing %q", b.in, err, b.want)
		}
	}
}

// A guarantee the pack set is lifted in the pack's declaration: the hint
// does not send the author to the command's, which cannot loosen it.
func TestExplainPackGuarantee(t *testing.T) {
	g, _ := Derive(Declared{Pack: &Declared{Network: "none"}}, Overrides{}, Declared{})
	var d Denials
	d.Observe(nil)(string(NoNetwork))
	msg, hint := d.Explain(g, "ext:p:get", "commands.get.capabilities of extension.yaml")
	if !strings.Contains(msg, "set by pack") || !strings.Contains(hint, "network: outbound in the pack's top-level capabilities") ||
		strings.Contains(hint, "commands.get") {
		t.Errorf("msg %q hint %q", msg, hint)
	}
}
