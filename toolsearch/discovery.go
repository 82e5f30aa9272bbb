package toolsearch

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/capgate/capgate/tool"
)

// Mode is how a caller discovers tools ([discovery] mode).
type Mode string

const (
	// ModeList lists every tool the caller may see (the default).
	ModeList Mode = "list"
	// ModeSearch lists the pinned tools, search_tools and call_tool.
	ModeSearch Mode = "search"
	// ModeAuto searches for a caller that sees more than Threshold tools.
	ModeAuto Mode = "auto"
)

// DefaultThreshold is auto mode's default: tool selection is reported to
// degrade beyond 30 to 50 tools.
const DefaultThreshold = 40

// Discovery is the [discovery] configuration.
type Discovery struct {
	Mode      Mode
	Threshold int      // auto: search above this many visible tools; 0 is DefaultThreshold
	Pinned    []string // tool ids listed in every mode
}

// Searching says whether a caller that sees visible tools gets search.
func (d Discovery) Searching(visible int) bool {
	switch d.Mode {
	case ModeSearch:
		return true
	case ModeAuto:
		t := d.Threshold
		if t <= 0 {
			t = DefaultThreshold
		}
		return visible > t
	}
	return false
}

// On says whether any caller may get search (search and call_tool are
// served).
func (d Discovery) On() bool { return d.Mode == ModeSearch || d.Mode == ModeAuto }

// IsPinned reports a tool listed in every mode.
func (d Discovery) IsPinned(id string) bool { return slices.Contains(d.Pinned, id) }

// The names of the two tools search mode lists.
const (
	SearchTool = "search_tools"
	CallTool   = "call_tool"
)

// Hit is one tool as a search answers it.
type Hit struct {
	Name        string          `json:"name"`         // what call_tool (or tools/call) takes
	ID          string          `json:"id,omitempty"` // the tool id, what the capability RPC takes
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
	Risk        string          `json:"risk"`
	SideEffects []string        `json:"side_effects"`
}

// HitOf is d as a search answers it; withID adds its tool id.
func HitOf(d *tool.Descriptor, withID bool) Hit {
	h := Hit{Name: d.ExposedName, Description: d.Description, InputSchema: d.InputSchema,
		Risk: d.Risk.Level.String(), SideEffects: make([]string, len(d.Risk.Effects))}
	if len(h.InputSchema) == 0 {
		h.InputSchema = json.RawMessage(`{"type":"object"}`)
	}
	for i, e := range d.Risk.Effects {
		h.SideEffects[i] = string(e)
	}
	if withID {
		h.ID = d.ID
	}
	return h
}

// SourceCount is how many tools a caller can reach in one source.
type SourceCount struct {
	Source string // the source id
	Tools  int
}

// Reach counts the tools allow accepts, per source, most first.
func Reach(tools []*tool.Descriptor, allow func(*tool.Descriptor) bool) (total int, sources []SourceCount) {
	at := map[string]int{}
	for _, d := range tools {
		if !allow(d) {
			continue
		}
		total++
		i, ok := at[d.Source]
		if !ok {
			i = len(sources)
			at[d.Source] = i
			sources = append(sources, SourceCount{Source: d.Source})
		}
		sources[i].Tools++
	}
	slices.SortStableFunc(sources, func(a, b SourceCount) int {
		return cmp.Or(cmp.Compare(b.Tools, a.Tools), strings.Compare(a.Source, b.Source))
	})
	return total, sources
}

// maxNamedSources bounds the sources search_tools's description names.
const maxNamedSources = 25

// SearchDescription is search_tools's description for a caller: what it
// can reach, so that an agent knows to search.
func SearchDescription(total int, sources []SourceCount) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Search the %d tools you can call here by what you want to do (for example \"create a GitHub issue\" or \"read a file\"). ", total)
	b.WriteString("It answers with the best matches: name, description, input schema, risk and side effects. Run one with call_tool. ")
	if len(sources) > 0 {
		names := make([]string, 0, min(len(sources), maxNamedSources))
		for _, s := range sources[:min(len(sources), maxNamedSources)] {
			names = append(names, fmt.Sprintf("%s (%d)", s.Source, s.Tools))
		}
		fmt.Fprintf(&b, "Sources: %s", strings.Join(names, ", "))
		if more := len(sources) - len(names); more > 0 {
			fmt.Fprintf(&b, " and %d more", more)
		}
		b.WriteString(".")
	}
	return b.String()
}

// SearchSchema and CallSchema are the input schemas of search_tools and
// call_tool.
var (
	SearchSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"query":{"type":"string","description":"what you want to do, in your own words"},` +
		`"limit":{"type":"integer","minimum":1,"maximum":20,"default":5,"description":"how many tools to return"}},` +
		`"required":["query"],"additionalProperties":false}`)
	CallSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"name":{"type":"string","description":"the tool's name, as search_tools gave it"},` +
		`"arguments":{"type":"object","description":"the tool's input, as its input schema describes"}},` +
		`"required":["name"],"additionalProperties":false}`)
)

// CallDescription is call_tool's description.
const CallDescription = "Run a tool that search_tools found, by its name, with its arguments. " +
	"It runs exactly as if called directly: the same permissions, risk, approvals and audit."

// SearchInput is search_tools's input, checked.
type SearchInput struct {
	Query string
	Limit int
}

// ParseSearch reads and checks search_tools's input (or the capability
// RPC's params): the query is required, the limit 1..20, default 5.
func ParseSearch(raw json.RawMessage) (SearchInput, error) {
	var in struct {
		Query *string         `json:"query"`
		Limit json.RawMessage `json:"limit"`
	}
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return SearchInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input: must be an object with query and limit: %v", SearchTool, err)
	}
	if in.Query == nil || strings.TrimSpace(*in.Query) == "" {
		return SearchInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.query: is required: say what you want to do", SearchTool)
	}
	if len(*in.Query) > 1000 {
		return SearchInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.query: is %d bytes; at most 1000", SearchTool, len(*in.Query))
	}
	out := SearchInput{Query: *in.Query, Limit: 5}
	if len(in.Limit) > 0 && string(in.Limit) != "null" {
		var n int
		if err := json.Unmarshal(in.Limit, &n); err != nil || n < 1 || n > MaxLimit {
			return SearchInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.limit: must be an integer from 1 to %d, not %s", SearchTool, MaxLimit, in.Limit)
		}
		out.Limit = n
	}
	return out, nil
}

// CallInput is call_tool's input, checked.
type CallInput struct {
	Name      string
	Arguments json.RawMessage // a JSON object, or nil
}

// ParseCall reads and checks call_tool's input.
func ParseCall(raw json.RawMessage) (CallInput, error) {
	var in struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return CallInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input: must be an object with name and arguments: %v", CallTool, err)
	}
	if in.Name == nil || strings.TrimSpace(*in.Name) == "" {
		return CallInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.name: is required: a tool's name from %s", CallTool, SearchTool)
	}
	if *in.Name == SearchTool || *in.Name == CallTool {
		return CallInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.name: %s is called directly, not through %s", CallTool, *in.Name, CallTool)
	}
	args := in.Arguments
	if s := strings.TrimSpace(string(args)); s == "null" || s == "" {
		args = nil
	} else if s[0] != '{' {
		return CallInput{}, tool.Errorf(tool.CodeInvalidInput, "%s input.arguments: must be an object, not %s", CallTool, shortJSON(args))
	}
	return CallInput{Name: *in.Name, Arguments: args}, nil
}

func shortJSON(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}
