package risk

import (
	"reflect"
	"strings"
	"testing"
)

func ptr(b bool) *bool { return &b }

func TestSplitWords(t *testing.T) {
	tests := map[string][]string{
		"read_file":           {"read", "file"},
		"readFile":            {"read", "file"},
		"HTTPGetURL":          {"http", "get", "url"},
		"email.list_messages": {"email", "list", "messages"},
		"a-b/c d":             {"a", "b", "c", "d"},
		"format":              {"format"},
		"v2Delete":            {"v2", "delete"},
	}
	for in, want := range tests {
		if got := splitWords(in); !reflect.DeepEqual(got, want) {
			t.Errorf("splitWords(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInfer(t *testing.T) {
	tests := []struct {
		name    string
		h       Hints
		level   Level
		effects []SideEffect
		rule    string // a rule that must have fired
	}{
		// Trusted annotations speak first; untrusted ones may only raise.
		{"trusted readOnly wins", Hints{Name: "delete_file", ReadOnly: ptr(true), TrustAnnotations: true}, Low, []SideEffect{}, "readOnlyHint → LOW"},
		{"untrusted readOnly lowers nothing", Hints{Name: "delete_file", Description: "Delete a file from disk", ReadOnly: ptr(true)}, High, []SideEffect{FSDelete}, "readOnlyHint ignored"},
		{"untrusted readOnly keeps write effects", Hints{Name: "write_notes", ReadOnly: ptr(true), Destructive: ptr(false)}, High, []SideEffect{FSWrite}, `word "write"`},
		{"readOnly keeps read effects", Hints{Name: "read_file", ReadOnly: ptr(true), OpenWorld: ptr(true), TrustAnnotations: true}, Low, []SideEffect{FSRead, NetworkHTTP}, "openWorldHint"},
		{"trusted destructive", Hints{Name: "tidy", Destructive: ptr(true), TrustAnnotations: true}, High, []SideEffect{}, "destructiveHint → HIGH"},
		{"untrusted destructive raises LOW to MED", Hints{Name: "search_docs", Destructive: ptr(true)}, Med, []SideEffect{}, "destructiveHint (not trusted) → at least MED"},
		{"untrusted destructive lowers nothing", Hints{Name: "delete_file", Destructive: ptr(false), ReadOnly: ptr(true)}, High, []SideEffect{FSDelete}, `word "delete"`},
		{"mcp-go defaults", Hints{Name: "echo", Destructive: ptr(true), OpenWorld: ptr(true)}, Med, []SideEffect{NetworkHTTP}, "destructiveHint"},
		{"mcp-go defaults, trusted", Hints{Name: "echo", Destructive: ptr(true), OpenWorld: ptr(true), TrustAnnotations: true}, High, []SideEffect{NetworkHTTP}, "destructiveHint → HIGH"},
		{"openWorld alone gives no level", Hints{Name: "get_weather", OpenWorld: ptr(true)}, Low, []SideEffect{NetworkHTTP}, `word "get" in name`},
		{"payments permission", Hints{Name: "get", Permissions: []string{"payments"}}, Critical, []SideEffect{Payments}, `permission "payments"`},
		{"cloud permission", Hints{Name: "x", Permissions: []string{"cloud"}}, Critical, []SideEffect{CloudResourceCreate}, "cloud"},
		{"network permission", Hints{Name: "get", Permissions: []string{"network"}}, High, []SideEffect{NetworkHTTP}, "network"},
		{"permission tag", Hints{Name: "x", Permissions: []string{"fs.read"}}, Med, []SideEffect{FSRead}, `permission "fs.read"`},
		{"delete word", Hints{Name: "delete_file"}, High, []SideEffect{FSDelete}, `word "delete" in name → HIGH, fs.delete`},
		{"camelCase", Hints{Name: "removeItem"}, High, []SideEffect{FSDelete}, `"remove"`},
		{"inflection", Hints{Name: "runs_tests"}, High, []SideEffect{SystemExec}, `"run"`},
		{"format is not rm", Hints{Name: "format"}, Med, []SideEffect{}, "MED"},
		{"thread is not read", Hints{Name: "thread_summary"}, Med, []SideEffect{}, "MED"},
		{"rm word", Hints{Name: "rm"}, High, []SideEffect{FSDelete}, `"rm"`},
		{"critical beats low", Hints{Name: "list_secrets"}, Critical, []SideEffect{CloudKeyRead}, `"secret"`},
		{"highest word wins", Hints{Name: "get_and_delete"}, High, []SideEffect{FSDelete}, `"delete"`},
		{"database domain", Hints{Name: "drop_table"}, High, []SideEffect{DatabaseDelete}, "database.delete"},
		{"charge", Hints{Name: "charge_card"}, Critical, []SideEffect{Payments}, `"charge"`},
		{"shell", Hints{Name: "shell"}, High, []SideEffect{SystemExec}, `"shell"`},
		{"low words", Hints{Name: "search_issues"}, Low, []SideEffect{}, `"search"`},
		{"description when the name is silent", Hints{Name: "gh_issue", Description: "Updates an issue"}, High, []SideEffect{FSWrite}, `word "update" in description`},
		// The higher of the name's and the description's evidence: a
		// harmless name does not hide a destructive description.
		{"description outranks a low name", Hints{Name: "get_thing", Description: "Deletes all user data permanently"}, High, []SideEffect{FSDelete}, `word "delete" in description → HIGH`},
		{"name outranks a low description", Hints{Name: "drop_table", Description: "Lists nothing; just goes"}, High, []SideEffect{DatabaseDelete}, `word "drop" in name → HIGH`},
		{"both low", Hints{Name: "list_files", Description: "Lists the files of a folder"}, Low, []SideEffect{}, `"list" in name`},
		{"nothing", Hints{Name: "echo", Description: "Echoes its input"}, Med, []SideEffect{}, "no rule gave a level → MED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := Infer(tt.h)
			if a.Level != tt.level {
				t.Errorf("level %s, want %s (rules %q)", a.Level, tt.level, a.Rules)
			}
			if !reflect.DeepEqual(a.Effects, tt.effects) {
				t.Errorf("effects %v, want %v (rules %q)", a.Effects, tt.effects, a.Rules)
			}
			if !strings.Contains(strings.Join(a.Rules, "\n"), tt.rule) {
				t.Errorf("rules %q do not include %q", a.Rules, tt.rule)
			}
			if a.LevelFrom != FromInference || a.EffectsFrom != FromInference {
				t.Errorf("provenance %s/%s, want inferred", a.LevelFrom, a.EffectsFrom)
			}
		})
	}
}

func TestAssessOperatorWins(t *testing.T) {
	h := Hints{Name: "delete_everything"} // infers HIGH, fs.delete
	declared := Declaration{Level: Med, Effects: []SideEffect{FSWrite}}
	operator := Declaration{Level: Low}

	a := Assess(operator, declared, h)
	if a.Level != Low || a.LevelFrom != FromOperator {
		t.Errorf("level %s from %s, want LOW from operator", a.Level, a.LevelFrom)
	}
	if !reflect.DeepEqual(a.Effects, []SideEffect{FSWrite}) || a.EffectsFrom != FromSource {
		t.Errorf("effects %v from %s, want the declared ones", a.Effects, a.EffectsFrom)
	}

	a = Assess(Declaration{}, Declaration{Effects: []SideEffect{}}, h)
	if a.Level != High || a.LevelFrom != FromInference || len(a.Effects) != 0 || a.EffectsFrom != FromSource {
		t.Errorf("declared empty effects: %+v", a)
	}
	if len(a.Rules) == 0 {
		t.Error("inferred level but no rules recorded")
	}
	a = Assess(Declaration{Level: Critical, Effects: []SideEffect{Payments}}, Declaration{}, h)
	if a.Level != Critical || a.EffectsFrom != FromOperator || a.Rules != nil {
		t.Errorf("operator everything: %+v", a)
	}
}
