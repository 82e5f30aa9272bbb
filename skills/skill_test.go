package skills

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/capgate/capgate/permissions"
)

const fullSkill = `---
name: email
description: Read and send email for the user.
authors: [Ash, "Rye Team"]
rationale: Email is where the work is.
sensitive: true
access:
  chat_types: [Private, GROUP]
env: [GOG_ACCOUNT]
packages:
  - gog
capabilities: [gog.email, gog.calendar]
allowed_tools:
  - bridge:gog:email.list_messages
  - mcp:filesystem:*
  - read_file
model: claude-sonnet
max_iterations: 4
permissions: [rye.fetch.knowledge.mcp.docs.*, rye/execute/tool/mcp/github/get_issue]
---

# Email

Read the inbox and answer.

` + "```xml" + `
<permissions>
  <execute><tool>mcp:slack:post</tool></execute>
  <acknowledge risk="write">posts a summary</acknowledge>
</permissions>
` + "```\n"

func TestParseFull(t *testing.T) {
	s, err := Parse("skills/email/SKILL.md", []byte(fullSkill))
	if err != nil {
		t.Fatal(err)
	}
	want := &Skill{
		Name: "email", Description: "Read and send email for the user.", Rationale: "Email is where the work is.",
		Model: "claude-sonnet", Authors: []string{"Ash", "Rye Team"}, Env: []string{"GOG_ACCOUNT"}, Packages: []string{"gog"},
		Capabilities: []string{"gog.email", "gog.calendar"},
		AllowedTools: []string{"bridge:gog:email.list_messages", "mcp:filesystem:*", "read_file"},
		Permissions:  []string{"rye.fetch.knowledge.mcp.docs.*", "rye/execute/tool/mcp/github/get_issue"},
		Sensitive:    true, ChatTypes: []string{"private", "group"}, MaxIterations: 4,
		Instructions: s.Instructions, Acknowledge: []string{"write"}, BlockGrants: []string{"rye.execute.tool.mcp.slack.post"},
		Path: "skills/email/SKILL.md",
	}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
	if !strings.HasPrefix(s.Instructions, "# Email\n\nRead the inbox") || !strings.HasSuffix(s.Instructions, "```") {
		t.Errorf("instructions %q", s.Instructions)
	}

	grants := []string{
		"rye.execute.tool.bridge.gog.email.*",
		"rye.execute.tool.bridge.gog.calendar.*",
		"rye.execute.tool.bridge.gog.email.list_messages",
		"rye.execute.tool.mcp.filesystem.*",
		"rye.fetch.knowledge.mcp.docs.*",
		"rye/execute/tool/mcp/github/get_issue",
		"rye.execute.tool.mcp.slack.post",
	}
	if got := s.Grants(); !reflect.DeepEqual(got, grants) {
		t.Errorf("grants\n got %q\nwant %q", got, grants)
	}
	if got := s.ToolNames(); !reflect.DeepEqual(got, []string{"read_file"}) {
		t.Errorf("tool names %q", got)
	}
	if s.FetchCapability() != "rye.fetch.directive.email" || s.ExecuteCapability() != "rye.execute.directive.email" {
		t.Errorf("capabilities %s %s", s.FetchCapability(), s.ExecuteCapability())
	}

	// The grants do what they say, as a permission set.
	set, err := permissions.NewSet(s.Grants()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id    string
		allow bool
	}{
		{"bridge:gog:email.send", true},            // capability gog.email
		{"bridge:gog:calendar.list", true},         // capability gog.calendar
		{"bridge:gog:drive.list", false},           // not declared
		{"mcp:filesystem:read_file", true},         // allowed_tools pattern
		{"mcp:github:get_issue", true},             // permissions field, '/' form
		{"mcp:github:create_issue", false},         // not declared
		{"mcp:slack:post", true},                   // <permissions> block
		{"ext:tools.email:list_messages", false},   // another kind
		{"bridge:gog:email.list_messages", true},   // allowed_tools id
		{"bridge:gogx:email.list_messages", false}, // another namespace
	} {
		if got := set.Allows(permissions.Required(permissions.Execute, permissions.Tool, c.id)); got != c.allow {
			t.Errorf("execute %s: allowed %v, want %v", c.id, got, c.allow)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	s, err := Parse("/w/skills/notes.md", []byte("---\ndescription: Take notes\n---\nWrite them down.\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "notes" || s.MaxIterations != 10 || s.Instructions != "Write them down." ||
		s.Sensitive || s.Grants() != nil || s.ToolNames() != nil || s.BlockGrants != nil {
		t.Fatalf("%+v", s)
	}
	// CRLF line endings, a byte-order mark, empty optional fields.
	s, err = Parse("x/crlf.md", []byte("\ufeff---\r\ndescription: d\r\nauthors:\r\nmodel:\r\nmax_iterations:\r\n---\r\nDo.\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Description != "d" || s.Instructions != "Do." || s.Authors != nil || s.MaxIterations != 10 {
		t.Fatalf("%+v", s)
	}
}

func TestParseErrors(t *testing.T) {
	const path = "skills/email/SKILL.md"
	known := "known fields: name, description, authors, rationale, sensitive, access, env, packages, capabilities, allowed_tools, model, max_iterations, permissions"
	tests := []struct {
		name string
		path string // default path
		src  string
		want []string // the errors, exactly, in order
	}{
		{"missing description", "", "---\nname: email\n---\nDo it.\n",
			[]string{path + ":1: field description is required: say in one line what the skill does and when to use it"}},
		{"blank description", "", "---\ndescription: '  '\n---\nDo it.\n",
			[]string{path + ":2: field description: must not be blank"}},
		{"empty description", "", "---\ndescription:\n---\nDo it.\n",
			[]string{path + ":2: field description: is empty; say in one line what the skill does and when to use it"}},
		{"description a number", "", "---\ndescription: 42\n---\nDo it.\n",
			[]string{path + ":2: field description: want a string, not a number (put it in quotes to make it a string)"}},
		{"empty frontmatter", "", "---\n---\nDo it.\n",
			[]string{path + ":1: the frontmatter is empty; field description is required: say in one line what the skill does and when to use it"}},
		{"unknown field", "", "---\ndescription: d\ndescripton: d\n---\nDo it.\n",
			[]string{path + `:3: unknown field "descripton" (did you mean "description"?); ` + known}},
		{"unknown field, dash", "", "---\ndescription: d\nallowed-tools: [x]\n---\nDo it.\n",
			[]string{path + `:3: unknown field "allowed-tools" (did you mean "allowed_tools"?); ` + known}},
		{"unknown field, far", "", "---\ndescription: d\nlicense: MIT\n---\nDo it.\n",
			[]string{path + `:3: unknown field "license"; ` + known}},
		{"name mismatch", "", "---\nname: mail\ndescription: d\n---\nDo it.\n",
			[]string{path + `:2: field name: "mail" does not match the skill's name "email", which comes from its file email/SKILL.md; make them equal, or leave name out`}},
		{"name mismatch, file form", "skills/notes.md", "---\nname: note\ndescription: d\n---\nDo it.\n",
			[]string{`skills/notes.md:2: field name: "note" does not match the skill's name "notes", which comes from its file notes.md; make them equal, or leave name out`}},
		{"bad file name", "skills/My-Skill.md", "---\ndescription: d\n---\nDo it.\n",
			[]string{`skills/My-Skill.md: "My-Skill" is not a valid skill name: use lower-case letters, digits, - and _, starting with a letter or digit`}},
		{"reserved name", "skills/defaults/SKILL.md", "---\ndescription: d\n---\nDo it.\n",
			[]string{`skills/defaults/SKILL.md: the name "defaults" is reserved for the config's [skills.defaults] table; rename the skill`}},
		{"not markdown", "skills/email.txt", "---\ndescription: d\n---\nDo it.\n",
			[]string{`skills/email.txt: not a skill file: a skill is <name>/SKILL.md or <name>.md`}},
		{"max_iterations 0", "", "---\ndescription: d\nmax_iterations: 0\n---\nDo it.\n",
			[]string{path + ":3: field max_iterations: must be at least 1, got 0"}},
		{"max_iterations negative", "", "---\ndescription: d\nmax_iterations: -3\n---\nDo it.\n",
			[]string{path + ":3: field max_iterations: must be at least 1, got -3"}},
		{"max_iterations string", "", "---\ndescription: d\nmax_iterations: ten\n---\nDo it.\n",
			[]string{path + ":3: field max_iterations: want a whole number of at least 1, not a string"}},
		{"max_iterations float", "", "---\ndescription: d\nmax_iterations: 2.5\n---\nDo it.\n",
			[]string{path + ":3: field max_iterations: want a whole number of at least 1, not a number"}},
		{"env lower case", "", "---\ndescription: d\nenv: [GOG_ACCOUNT, api_key, 1X]\n---\nDo it.\n",
			[]string{
				path + `:3: field env: "api_key" is not an UPPER_CASE environment variable name (letters A-Z, digits and _, not starting with a digit); did you mean "API_KEY"?`,
				path + `:3: field env: "1X" is not an UPPER_CASE environment variable name (letters A-Z, digits and _, not starting with a digit)`,
			}},
		{"capability not namespaced", "", "---\ndescription: d\ncapabilities:\n  - gog.email\n  - email\n  - Gog.Email\n---\nDo it.\n",
			[]string{
				path + `:5: field capabilities: "email" is not a namespaced capability id: want <namespace>.<capability> in lower case, such as gog.email`,
				path + `:6: field capabilities: "Gog.Email" is not a namespaced capability id: want <namespace>.<capability> in lower case, such as gog.email`,
			}},
		{"bad permission", "", "---\ndescription: d\npermissions: [rye.execute.tool.*, \"rye.a b\"]\n---\nDo it.\n",
			[]string{path + `:3: field permissions: grant "rye.a b" contains white space or a control character`}},
		{"bad allowed tool", "", "---\ndescription: d\nallowed_tools: [\"mcp:fs\", \"read file\", \"web:x:y\"]\n---\nDo it.\n",
			[]string{
				path + `:3: field allowed_tools: tool id "mcp:fs": want <kind>:<source>:<name>`,
				path + `:3: field allowed_tools: "read file" is neither a tool id <kind>:<source>:<name> nor an exposed tool name (letters, digits, _ and -, at most 64)`,
				path + `:3: field allowed_tools: tool id "web:x:y": unknown source kind "web": valid kinds are ext, bridge, mcp`,
			}},
		{"empty instructions", "", "---\ndescription: d\n---\n  \n\n",
			[]string{path + ":3: no instructions: write the skill's instructions in markdown after the closing ---"}},
		{"no instructions at all", "", "---\ndescription: d\n---",
			[]string{path + ":3: no instructions: write the skill's instructions in markdown after the closing ---"}},
		{"no frontmatter", "", "# Email\n\nDo it.\n",
			[]string{path + `:1: no frontmatter: a SKILL.md starts with a line "---", then YAML fields (at least description), then a line "---", then the instructions`}},
		{"frontmatter not closed", "", "---\ndescription: d\nDo it.\n",
			[]string{path + `:1: the frontmatter that starts here is not closed: add a line "---" after its fields`}},
		{"authors a string", "", "---\ndescription: d\nauthors: Ash\n---\nDo it.\n",
			[]string{path + `:3: field authors: want a list of strings, not a string (write [Ash], or one item a line, each after "- ")`}},
		{"packages item a mapping", "", "---\ndescription: d\npackages:\n  - gog\n  - {name: x}\n  - ''\n---\nDo it.\n",
			[]string{
				path + ":5: field packages: want a list of strings; item 2 is a mapping",
				path + ":6: field packages: item 3 is blank",
			}},
		{"sensitive a string", "", "---\ndescription: d\nsensitive: yes\n---\nDo it.\n",
			[]string{path + ":3: field sensitive: want true or false, not a string"}},
		{"model a list", "", "---\ndescription: d\nmodel: [a, b]\n---\nDo it.\n",
			[]string{path + ":3: field model: want a string, not a list"}},
		{"access a list", "", "---\ndescription: d\naccess: [private]\n---\nDo it.\n",
			[]string{path + ":3: field access: want a mapping such as {chat_types: [private]}, not a list"}},
		{"access unknown key", "", "---\ndescription: d\naccess:\n  chat_type: [private]\n---\nDo it.\n",
			[]string{path + `:4: field access: unknown key "chat_type" (did you mean "chat_types"?); the only key is chat_types`}},
		{"chat_types a string", "", "---\ndescription: d\naccess:\n  chat_types: private\n---\nDo it.\n",
			[]string{path + `:4: field access.chat_types: want a list of strings, not a string (write [private], or one item a line, each after "- ")`}},
		{"frontmatter a list", "", "---\n- description\n---\nDo it.\n",
			[]string{path + `:2: the frontmatter must be fields written as "name: value", not a list`}},
		{"field twice", "", "---\ndescription: d\nmodel: a\ndescription: e\n---\nDo it.\n",
			[]string{path + ":4: field description: given twice (first on line 2)"}},
		{"bad yaml", "", "---\ndescription: d\nenv: [A\n---\nDo it.\n",
			[]string{path + ":3: frontmatter is not valid YAML: did not find expected ',' or ']'"}},
		{"tab indentation", "", "---\ndescription: d\naccess:\n\tchat_types: [x]\n---\nDo it.\n",
			[]string{path + ":4: frontmatter is not valid YAML: found character that cannot start any token"}},
		{"bad yaml first line", "", "---\ndescription: a: b\n---\nDo it.\n",
			[]string{path + ":2: frontmatter is not valid YAML: mapping values are not allowed in this context"}},
		{"bad permissions block", "", "---\ndescription: d\n---\nDo it.\n\n<permissions>\n  <search>*</search>\n</permissions>\n",
			[]string{path + ":7: <permissions>: unknown tag <search> (Rye's former name; capgate calls it <fetch>); valid tags: acknowledge, execute, fetch, sign"}},
		{"several at once", "", "---\nname: Mail\nmax_iterations: 0\nsensitive: 1\n---\n",
			[]string{
				path + `:2: field name: "Mail" does not match the skill's name "email", which comes from its file email/SKILL.md; make them equal, or leave name out`,
				path + ":3: field max_iterations: must be at least 1, got 0",
				path + ":4: field sensitive: want true or false, not a number",
				path + ":1: field description is required: say in one line what the skill does and when to use it",
				path + ":5: no instructions: write the skill's instructions in markdown after the closing ---",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path
			if p == "" {
				p = path
			}
			s, err := Parse(p, []byte(tc.src))
			if err == nil {
				t.Fatalf("no error; parsed %+v", s)
			}
			if s != nil {
				t.Errorf("a skill with an error: %+v", s)
			}
			if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("errors\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestParseErrorLines checks that the *Error values carry file, line and field.
func TestParseErrorLines(t *testing.T) {
	_, err := Parse("a/b.md", []byte("---\ndescription: d\n\nenv: [x]\n---\nDo.\n"))
	var e *Error
	if !errors.As(err, &e) || e.Path != "a/b.md" || e.Line != 4 || e.Field != "env" {
		t.Fatalf("%#v", e)
	}
	_, err = Parse("a/b.md", []byte("---\ndescription: d\n---\nDo.\n<permissions>\n<execute></execute>\n</permissions>\n"))
	if !errors.As(err, &e) || e.Line != 6 || e.Error() != "a/b.md:6: <execute> is empty; list <tool>, <directive> or <knowledge> items, or write *" {
		t.Fatalf("%v", err)
	}
}
