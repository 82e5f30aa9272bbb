// Package skills reads skills as Ash's skills spec writes them: a SKILL.md
// (or <name>.md) that starts with YAML frontmatter between "---" lines and
// continues with markdown instructions. It finds skills in their sources in
// precedence order, validates them with messages that name the file, the
// line and the field, works out each skill's grants for its inner calls, and
// applies the host config's [skills.NAME] tables.
package skills

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capgate/capgate/internal/suggest"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/tool"
)

// DefaultMaxIterations is max_iterations when the frontmatter leaves it out.
const DefaultMaxIterations = 10

// DefaultsName is the [skills.defaults] table of the config, which holds
// settings for every skill; no skill may take this name.
const DefaultsName = "defaults"

// Skill is one valid skill.
type Skill struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Rationale   string   `json:"rationale,omitempty"`
	Model       string   `json:"model,omitempty"`
	Authors     []string `json:"authors,omitempty"`
	Env         []string `json:"env,omitempty"`      // names of the environment variables the skill needs
	Packages    []string `json:"packages,omitempty"` // packages the skill's instructions use
	// Capabilities are namespaced capability ids such as gog.email.
	Capabilities []string `json:"capabilities,omitempty"`
	// AllowedTools are tool ids (<kind>:<source>:<name>, the name may be an
	// fnmatch pattern) or exposed tool names.
	AllowedTools []string `json:"allowed_tools,omitempty"`
	// Permissions are capability strings from the permissions field, as written.
	Permissions []string `json:"permissions,omitempty"`
	Sensitive   bool     `json:"sensitive,omitempty"`
	ChatTypes   []string `json:"chat_types,omitempty"` // access.chat_types, lower-cased
	// MaxIterations is max_iterations, DefaultMaxIterations when not given.
	MaxIterations int `json:"max_iterations"`
	// Instructions is the markdown after the frontmatter, trimmed. A
	// <permissions> block in it is left in place.
	Instructions string `json:"instructions"`
	// Acknowledge lists the tiers a <permissions> block in the body acknowledges.
	Acknowledge []string `json:"acknowledge,omitempty"`
	// BlockGrants are the grants of a <permissions> block in the body.
	BlockGrants []string `json:"block_grants,omitempty"`

	// Source is where Discover found the skill (bundled, integration,
	// installed, user, workspace); Path is its file.
	Source string `json:"source,omitempty"`
	Path   string `json:"path"`
	// Overrides are the files of valid skills of the same name this one
	// shadows, lowest precedence first.
	Overrides []string `json:"overrides,omitempty"`

	// Set by Apply from the config: the chat ids allowed to use the skill
	// ([skills.NAME] allow_chat_ids, else [skills.defaults] allow_chat_ids;
	// none means no restriction by chat id) and the values of its
	// environment variables ([skills.NAME] env). Model is replaced by
	// [skills.NAME] model when that is set.
	AllowChatIDs []string          `json:"allow_chat_ids,omitempty"`
	EnvValues    map[string]string `json:"-"`
}

// Error is one problem in a skill file. Parse returns one *Error, or
// several joined with errors.Join.
type Error struct {
	Path  string
	Line  int    // 0 when unknown
	Field string // the frontmatter field, "" when the problem is not in one
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString("field " + e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var (
	nameRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	envRE        = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	capabilityRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*\.[a-z0-9][a-z0-9_-]*$`)
)

// ValidName reports whether name is a valid skill name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// KnownFields are the frontmatter fields, in the order messages list them.
var KnownFields = []string{"name", "description", "authors", "rationale", "sensitive", "access",
	"env", "packages", "capabilities", "allowed_tools", "model", "max_iterations", "permissions"}

// NameFromPath is the skill name a file's path gives: the directory's name
// for .../<name>/SKILL.md, the file's name for .../<name>.md.
func NameFromPath(path string) (string, error) {
	base := filepath.Base(path)
	if base == "SKILL.md" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return "", err
		}
		return filepath.Base(filepath.Dir(abs)), nil
	}
	if name, ok := strings.CutSuffix(base, ".md"); ok && name != "" {
		return name, nil
	}
	return "", errors.New("not a skill file: a skill is <name>/SKILL.md or <name>.md")
}

func checkName(name string) string {
	switch {
	case name == DefaultsName:
		return `the name "defaults" is reserved for the config's [skills.defaults] table; rename the skill`
	case !ValidName(name):
		return fmt.Sprintf("%q is not a valid skill name: use lower-case letters, digits, - and _, starting with a letter or digit", name)
	}
	return ""
}

// Parse reads and validates one skill file. path names the file in
// messages and gives the skill its name (see NameFromPath). Every error
// names the file, and the line when it is known.
func Parse(path string, data []byte) (*Skill, error) {
	name, err := NameFromPath(path)
	if err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	if msg := checkName(name); msg != "" {
		return nil, &Error{Path: path, Msg: msg}
	}
	p := &parser{path: path, s: &Skill{Name: name, Path: path, MaxIterations: DefaultMaxIterations}}
	front, body, closeLine, ferr := splitFrontmatter(data)
	if ferr != nil {
		ferr.Path = path
		return nil, ferr
	}
	p.frontmatter(front)
	p.body(body, closeLine)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return p.s, nil
}

// splitFrontmatter splits a skill file into the YAML between its first two
// "---" lines and the text after them. closeLine is the line of the second
// "---"; the YAML starts on line 2.
func splitFrontmatter(data []byte) (front, body []byte, closeLine int, err *Error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	isFence := func(line []byte) bool { return string(bytes.TrimRight(line, " \t\r")) == "---" }
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if !isFence(first) {
		return nil, nil, 0, &Error{Line: 1, Msg: `no frontmatter: a SKILL.md starts with a line "---", then YAML fields (at least description), then a line "---", then the instructions`}
	}
	off := 0
	for line := 2; off <= len(rest); line++ {
		end := bytes.IndexByte(rest[off:], '\n')
		var l []byte
		if end < 0 {
			l = rest[off:]
		} else {
			l = rest[off : off+end]
		}
		if isFence(l) {
			if end < 0 {
				return rest[:off], nil, line, nil
			}
			return rest[:off], rest[off+end+1:], line, nil
		}
		if end < 0 {
			break
		}
		off += end + 1
	}
	return nil, nil, 0, &Error{Line: 1, Msg: `the frontmatter that starts here is not closed: add a line "---" after its fields`}
}

type parser struct {
	path string
	s    *Skill
	errs []error
}

func (p *parser) fail(line int, field, format string, args ...any) {
	p.errs = append(p.errs, &Error{Path: p.path, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// fileLine turns a line of the frontmatter's YAML into a line of the file.
func fileLine(yamlLine int) int { return yamlLine + 1 }

var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yaml.v3 numbers lines from 1 in its scanner's errors but from 0 in its
// parser's; these are the parser's.
var yamlParserProblems = []string{
	"did not find expected ',' or ']'", "did not find expected ',' or '}'", "did not find expected '-' indicator",
	"did not find expected <document start>", "did not find expected <stream-start>", "did not find expected key",
	"did not find expected node content", "found duplicate %TAG directive", "found duplicate %YAML directive",
	"found incompatible YAML document", "found undefined tag handle",
}

func (p *parser) frontmatter(front []byte) {
	var doc yaml.Node
	if err := yaml.Unmarshal(front, &doc); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		line := 1 // yaml.v3 leaves out the line for problems on the first one
		if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = m[2]
			if slices.Contains(yamlParserProblems, msg) {
				line++
			}
		}
		p.fail(fileLine(line), "", "frontmatter is not valid YAML: %s", msg)
		return
	}
	var root *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = deref(doc.Content[0])
	}
	if root == nil || (root.Kind == yaml.ScalarNode && root.Tag == "!!null") {
		p.fail(1, "", "the frontmatter is empty; field description is required: say in one line what the skill does and when to use it")
		return
	}
	if root.Kind != yaml.MappingNode {
		p.fail(fileLine(root.Line), "", "the frontmatter must be fields written as \"name: value\", not %s", describe(root))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], deref(root.Content[i+1])
		key := k.Value
		line := fileLine(k.Line)
		if prev, ok := seen[key]; ok {
			p.fail(line, key, "given twice (first on line %d)", prev)
			continue
		}
		seen[key] = line
		if !slices.Contains(KnownFields, key) {
			hint := ""
			if s := suggest.Nearest(key, KnownFields); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			p.fail(line, "", "unknown field %q%s; known fields: %s", key, hint, strings.Join(KnownFields, ", "))
			continue
		}
		p.field(key, v)
	}
	if _, ok := seen["description"]; !ok {
		p.fail(1, "", "field description is required: say in one line what the skill does and when to use it")
	}
}

// deref follows aliases.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// describe names the YAML type of n for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return "a string"
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "true or false"
		case "!!null":
			return "empty"
		case "!!timestamp":
			return "a date"
		}
	}
	return "a " + strings.TrimPrefix(n.Tag, "!!")
}

func (p *parser) field(key string, v *yaml.Node) {
	s := p.s
	line := fileLine(v.Line)
	switch key {
	case "name":
		if n, ok := p.str(key, v, true); ok && n != s.Name {
			p.fail(line, key, "%q does not match the skill's name %q, which comes from its file %s; make them equal, or leave name out",
				n, s.Name, p.nameSource())
		}
	case "description":
		if isNull(v) {
			p.fail(line, key, "is empty; say in one line what the skill does and when to use it")
			return
		}
		if d, ok := p.str(key, v, true); ok {
			s.Description = strings.TrimSpace(d)
		}
	case "rationale":
		s.Rationale, _ = p.str(key, v, false)
	case "model":
		s.Model, _ = p.str(key, v, false)
	case "sensitive":
		if isNull(v) {
			return
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
			p.fail(line, key, "want true or false, not %s", describe(v))
			return
		}
		var b bool
		if err := v.Decode(&b); err != nil {
			p.fail(line, key, "%v", err)
			return
		}
		s.Sensitive = b
	case "max_iterations":
		if isNull(v) {
			return
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
			p.fail(line, key, "want a whole number of at least 1, not %s", describe(v))
			return
		}
		n, err := strconv.ParseInt(v.Value, 0, 32)
		if err != nil {
			p.fail(line, key, "%s is not a whole number in range", v.Value)
			return
		}
		if n < 1 {
			p.fail(line, key, "must be at least 1, got %d", n)
			return
		}
		s.MaxIterations = int(n)
	case "authors":
		s.Authors = p.list(key, v, nil)
	case "packages":
		s.Packages = p.list(key, v, nil)
	case "env":
		s.Env = p.list(key, v, func(item string) string {
			if envRE.MatchString(item) {
				return ""
			}
			msg := fmt.Sprintf("%q is not an UPPER_CASE environment variable name (letters A-Z, digits and _, not starting with a digit)", item)
			if up := strings.ToUpper(item); envRE.MatchString(up) {
				msg += fmt.Sprintf("; did you mean %q?", up)
			}
			return msg
		})
	case "capabilities":
		s.Capabilities = p.list(key, v, func(item string) string {
			if capabilityRE.MatchString(item) {
				return ""
			}
			return fmt.Sprintf("%q is not a namespaced capability id: want <namespace>.<capability> in lower case, such as gog.email", item)
		})
	case "allowed_tools":
		s.AllowedTools = p.list(key, v, func(item string) string {
			if strings.Contains(item, ":") {
				if _, _, _, err := tool.ParseID(item); err != nil {
					return err.Error()
				}
				return ""
			}
			if !tool.ValidExposedName(item) {
				return fmt.Sprintf("%q is neither a tool id <kind>:<source>:<name> nor an exposed tool name (letters, digits, _ and -, at most 64)", item)
			}
			return ""
		})
	case "permissions":
		s.Permissions = p.list(key, v, func(item string) string {
			if _, err := permissions.ParseGrant(item); err != nil {
				return err.Error()
			}
			return ""
		})
	case "access":
		p.access(v)
	}
}

// nameSource is the part of the path the name comes from.
func (p *parser) nameSource() string {
	if filepath.Base(p.path) == "SKILL.md" {
		return p.s.Name + "/SKILL.md"
	}
	return filepath.Base(p.path)
}

// str reads a string field. A null value is "" unless required.
func (p *parser) str(key string, v *yaml.Node, required bool) (string, bool) {
	line := fileLine(v.Line)
	if isNull(v) && !required {
		return "", true
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
		hint := ""
		if v.Kind == yaml.ScalarNode && !isNull(v) {
			hint = " (put it in quotes to make it a string)"
		}
		p.fail(line, key, "want a string, not %s%s", describe(v), hint)
		return "", false
	}
	if required && strings.TrimSpace(v.Value) == "" {
		p.fail(line, key, "must not be blank")
		return "", false
	}
	return v.Value, true
}

// list reads a list of non-blank strings, checking each with check, which
// returns a message for a bad item.
func (p *parser) list(key string, v *yaml.Node, check func(string) string) []string {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		hint := ""
		if v.Kind == yaml.ScalarNode {
			hint = fmt.Sprintf(" (write [%s], or one item a line, each after \"- \")", v.Value)
		}
		p.fail(fileLine(v.Line), key, "want a list of strings, not %s%s", describe(v), hint)
		return nil
	}
	out := make([]string, 0, len(v.Content))
	for i, it := range v.Content {
		it = deref(it)
		line := fileLine(it.Line)
		if it.Kind != yaml.ScalarNode || it.Tag != "!!str" {
			p.fail(line, key, "want a list of strings; item %d is %s", i+1, describe(it))
			continue
		}
		item := strings.TrimSpace(it.Value)
		if item == "" {
			p.fail(line, key, "item %d is blank", i+1)
			continue
		}
		if check != nil {
			if msg := check(item); msg != "" {
				p.fail(line, key, "%s", msg)
				continue
			}
		}
		out = append(out, item)
	}
	return out
}

func (p *parser) access(v *yaml.Node) {
	if isNull(v) {
		return
	}
	if v.Kind != yaml.MappingNode {
		p.fail(fileLine(v.Line), "access", "want a mapping such as {chat_types: [private]}, not %s", describe(v))
		return
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], deref(v.Content[i+1])
		if k.Value != "chat_types" {
			hint := ""
			if s := suggest.Nearest(k.Value, []string{"chat_types"}); s != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", s)
			}
			p.fail(fileLine(k.Line), "access", "unknown key %q%s; the only key is chat_types", k.Value, hint)
			continue
		}
		types := p.list("access.chat_types", val, nil)
		for j := range types {
			types[j] = strings.ToLower(types[j])
		}
		p.s.ChatTypes = types
	}
}

// body reads the instructions and an optional <permissions> block.
// closeLine is the line of the "---" that ends the frontmatter.
func (p *parser) body(body []byte, closeLine int) {
	p.s.Instructions = strings.TrimSpace(string(body))
	if p.s.Instructions == "" {
		p.fail(closeLine, "", "no instructions: write the skill's instructions in markdown after the closing ---")
		return
	}
	// Pad with the frontmatter's lines so the block's lines are the file's.
	src := append(bytes.Repeat([]byte("\n"), closeLine), body...)
	perms, err := permissions.ParseDirective(p.path, src)
	if errors.Is(err, permissions.ErrNoPermissions) {
		return
	}
	if err != nil {
		// ParseDirective's errors read "path:line: message".
		rest := strings.TrimPrefix(err.Error(), p.path+":")
		if n, msg, ok := strings.Cut(rest, ": "); ok {
			if line, aerr := strconv.Atoi(n); aerr == nil {
				p.fail(line, "", "%s", msg)
				return
			}
		}
		p.errs = append(p.errs, err)
		return
	}
	p.s.BlockGrants = perms.Grants
	p.s.Acknowledge = perms.Tiers()
}

// Grants are the skill's grants for its inner calls: each capability id
// ns.cap becomes rye.execute.tool.bridge.ns.cap.*, each allowed_tools
// entry that is a tool id the grant to execute that tool, then the
// permissions field and the body's <permissions> block as written. Each
// grant appears once. Allowed tools given by exposed name are not here:
// see ToolNames.
func (s *Skill) Grants() []string {
	var out []string
	add := func(g string) {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	for _, c := range s.Capabilities {
		add("rye.execute.tool.bridge." + c + ".*")
	}
	for _, t := range s.AllowedTools {
		if strings.Contains(t, ":") {
			add(permissions.Required(permissions.Execute, permissions.Tool, t))
		}
	}
	for _, g := range s.Permissions {
		add(g)
	}
	for _, g := range s.BlockGrants {
		add(g)
	}
	return out
}

// ToolNames are the allowed_tools entries that are exposed names rather
// than tool ids; the router resolves them to tools (and grants).
func (s *Skill) ToolNames() []string {
	var out []string
	for _, t := range s.AllowedTools {
		if !strings.Contains(t, ":") {
			out = append(out, t)
		}
	}
	return out
}

// FetchCapability is what seeing the skill requires: rye.fetch.directive.<name>.
func (s *Skill) FetchCapability() string {
	return permissions.Required(permissions.Fetch, permissions.Directive, s.Name)
}

// ExecuteCapability is what running the skill requires: rye.execute.directive.<name>.
func (s *Skill) ExecuteCapability() string {
	return permissions.Required(permissions.Execute, permissions.Directive, s.Name)
}
