package skills

import (
	"reflect"
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	root := t.TempDir()
	write(t, root, "skills/email.md", "---\ndescription: mail\nenv: [GOG_ACCOUNT]\nmodel: small\n---\nDo.\n")
	write(t, root, "skills/notes.md", skillMD("notes"))
	write(t, root, "skills/deploy.md", skillMD("deploy"))
	write(t, root, "skills/search.md", "---\ndescription: search\nenv: [API_KEY, API_URL]\n---\nDo.\n")
	write(t, root, "skills/chat.md", skillMD("chat"))
	write(t, root, "skills/quiet.md", "---\ndescription: quiet\nenv: [TOKEN]\n---\nDo.\n")
	set, err := Discover(Options{Workspace: root, Home: root})
	if err != nil || len(set.Skills) != 6 || len(set.Problems) != 0 {
		t.Fatalf("%v %+v %+v", err, set.Skills, set.Problems)
	}

	no, yes := false, true
	cfg := map[string]Settings{
		"defaults": {AllowChatIDs: []string{"100", "200"}},
		"email":    {Model: "large", AllowChatIDs: []string{"7"}, Env: map[string]string{"GOG_ACCOUNT": "me@example.com"}},
		"deploy":   {Enabled: &no},
		"search":   {Env: map[string]string{"API_KEY": ""}},
		"chat":     {Enabled: &yes, AllowChatIDs: []string{}},
		"quiet":    {Enabled: &no},
		"emial":    {Model: "x"},
	}
	enabled, problems := Apply(set, cfg)

	type row struct {
		name, model string
		chats       []string
		env         map[string]string
	}
	var got []row
	for _, s := range enabled {
		got = append(got, row{s.Name, s.Model, s.AllowChatIDs, s.EnvValues})
	}
	want := []row{
		{"chat", "", []string{}, nil}, // its own, empty, allow_chat_ids
		{"email", "large", []string{"7"}, map[string]string{"GOG_ACCOUNT": "me@example.com"}},
		{"notes", "", []string{"100", "200"}, nil}, // no table: the defaults
		// deploy and quiet: enabled = false (quiet's missing env is no problem then);
		// search: env missing.
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("enabled\n got %+v\nwant %+v", got, want)
	}
	// Apply works on copies.
	if e := set.Get("email"); e.Model != "small" || e.AllowChatIDs != nil || e.EnvValues != nil {
		t.Errorf("set changed: %+v", e)
	}

	var msgs []string
	for _, p := range problems {
		if p.Source != "config" {
			t.Errorf("source %q", p.Source)
		}
		msgs = append(msgs, p.Name+": "+p.Error())
	}
	wantMsgs := []string{
		`emial: [skills.emial] in the config: there is no skill "emial" (did you mean "email"? the skills are chat, deploy, email, notes, quiet, search)`,
		`search: skill search needs the environment variable API_KEY, but [skills.search] env gives it an empty value; the skill is not enabled`,
		`search: skill search needs the environment variable API_URL: set it in the config, [skills.search] env = { API_URL = "..." }; the skill is not enabled`,
	}
	if !reflect.DeepEqual(msgs, wantMsgs) {
		t.Errorf("problems\n got %q\nwant %q", msgs, wantMsgs)
	}
}

func TestApplyEnvKeys(t *testing.T) {
	set := &Set{Skills: []*Skill{{Name: "a", Env: []string{"KEY"}}}}
	enabled, problems := Apply(set, map[string]Settings{"a": {Env: map[string]string{"KEY": "v", "lower": "x"}}})
	if len(enabled) != 0 || len(problems) != 1 ||
		problems[0].Error() != `[skills.a] env: "lower" is not an UPPER_CASE environment variable name` {
		t.Fatalf("%+v %+v", enabled, problems)
	}
	enabled, problems = Apply(&Set{}, map[string]Settings{"defaults": {AllowChatIDs: []string{"1"}}, "x": {}})
	if len(enabled) != 0 || len(problems) != 1 || !strings.Contains(problems[0].Error(), `there is no skill "x" (there are no skills)`) {
		t.Fatalf("%+v %+v", enabled, problems)
	}
}
