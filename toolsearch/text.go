package toolsearch

import (
	"encoding/json"
	"iter"
	"slices"
	"strings"
	"unicode"

	"github.com/capgate/capgate/tool"
)

// words splits an identifier into its words, lower-cased: snake_case,
// kebab-case, camelCase, dotted.names, HTTPServer → http server.
func words(s string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	rs := []rune(s)
	for i, r := range rs {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
			continue
		case unicode.IsUpper(r) && len(cur) > 0:
			prev := rs[i-1]
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			// aB starts a word; so does the B of ABc (HTTPServer).
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				flush()
			}
		}
		cur = append(cur, r)
	}
	flush()
	return out
}

// nameText is the name field: the exposed name's and the source's name's
// words, and the title.
func nameText(d *tool.Descriptor) string {
	w := words(d.ExposedName)
	if d.Name != d.ExposedName {
		w = append(w, words(d.Name)...)
	}
	if d.Title != "" {
		w = append(w, d.Title)
	}
	return strings.Join(w, " ")
}

func descriptionText(d *tool.Descriptor) string { return d.Description }

// sourceText is the source field: the source's id in words, and its kind.
func sourceText(d *tool.Descriptor) string {
	return strings.Join(append(words(d.Source), string(d.Kind)), " ")
}

// paramsText is the parameters field: each property's name in words and
// its description, nested objects and arrays' items included, to a depth
// that a real schema needs.
func paramsText(schema json.RawMessage) string {
	var s schemaNode
	if len(schema) == 0 || json.Unmarshal(schema, &s) != nil {
		return ""
	}
	var b strings.Builder
	s.write(&b, 0)
	return b.String()
}

type schemaNode struct {
	Description string                `json:"description"`
	Properties  map[string]schemaNode `json:"properties"`
	Items       *schemaNode           `json:"items"`
}

func (s *schemaNode) write(b *strings.Builder, depth int) {
	if depth > 3 {
		return
	}
	for name, p := range s.Properties {
		b.WriteString(strings.Join(words(name), " "))
		b.WriteString(". ")
		if p.Description != "" {
			b.WriteString(p.Description)
			b.WriteString(". ")
		}
		p.write(b, depth+1)
	}
	if s.Items != nil {
		s.Items.write(b, depth+1)
	}
}

// queryWords are the words of a user's query worth searching for: split
// like names, stop words dropped.
func queryWords(q string) []string {
	var out []string
	for _, w := range words(q) {
		if !stopWords[w] {
			out = append(out, w)
		}
	}
	return out
}

// stopWords are English words that say nothing about which tool is meant.
var stopWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an the and or but if of to in on at by for from with without into onto
		about as is are was were be been being am do does did done have has had can could should would will
		shall may might must i me my mine we us our you your it its this that these those there here what
		which who whom whose when where why how all any some each every no not so than too very just also
		please want need like get let make using use via tool tools some something thing things`) {
		m[w] = true
	}
	return m
}()

// synonymGroups are words people use for one another when they name an
// action or a thing. A query word brings in the others of its groups that
// the catalog uses (Index.present), at the same weight.
var synonymGroups = [][]string{
	{"find", "search", "lookup", "query", "locate"},
	{"delete", "remove", "erase", "drop", "destroy"},
	{"create", "add", "new", "make", "insert"},
	{"update", "edit", "modify", "change", "patch", "set"},
	{"read", "open", "view", "show", "display", "fetch", "retrieve"},
	{"list", "enumerate", "browse", "all"},
	{"write", "save", "store", "put"},
	{"run", "execute", "exec", "launch", "start", "invoke", "trigger"},
	{"stop", "kill", "terminate", "cancel", "end", "halt"},
	{"send", "post", "message", "notify"},
	{"file", "document", "doc"},
	{"folder", "directory", "dir"},
	{"picture", "image", "photo", "screenshot"},
	{"website", "site", "web", "page", "url", "webpage"},
	{"move", "rename", "relocate"},
	{"copy", "duplicate", "clone"},
	{"download", "fetch", "retrieve"},
	{"upload", "push"},
	{"issue", "bug", "ticket"},
	{"pr", "merge", "pull"},
	{"comment", "reply", "note"},
	{"customer", "client", "user"},
	{"payment", "charge", "pay"},
	{"refund", "reimburse"},
	{"invoice", "bill", "billing"},
	{"subscription", "plan", "recurring"},
	{"collection", "table"},
	{"record", "row", "document", "entry"},
	{"container", "pod"},
	{"log", "logs", "output"},
	{"click", "press", "tap"},
	{"type", "fill", "enter", "input"},
	{"navigate", "go", "visit", "open"},
	{"scrape", "crawl", "extract"},
	{"map", "geocode", "location", "address", "place"},
	{"direction", "route", "distance"},
	{"memory", "remember", "knowledge", "graph"},
	{"entity", "node"},
	{"relation", "relationship", "link", "edge"},
	{"channel", "room", "conversation"},
	{"repository", "repo", "project"},
	{"branch", "ref"},
	{"commit", "change"},
	{"schema", "structure", "columns"},
	{"database", "db"},
	{"size", "info", "metadata", "stat", "details"},
	{"library", "package", "dependency"},
	{"documentation", "docs", "manual", "reference"},
	{"process", "program", "task"},
	{"key", "redis", "cache"},
	{"weather", "forecast"},
	{"news", "headlines"},
}

var synonyms = func() map[string][]string {
	m := map[string][]string{}
	for _, g := range synonymGroups {
		for _, w := range g {
			for _, o := range g {
				if o != w && !slices.Contains(m[w], o) {
					m[w] = append(m[w], o)
				}
			}
		}
	}
	return m
}()

// synonymWords are every word of the synonym groups.
func synonymWords() iter.Seq[string] {
	return func(yield func(string) bool) {
		for w := range synonyms {
			if !yield(w) {
				return
			}
		}
	}
}
