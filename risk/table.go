package risk

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/capgate/capgate/permissions"
)

// Policy is what a tier asks of a grant in it.
type Policy string

const (
	Allow               Policy = "allow"
	AcknowledgeRequired Policy = "acknowledge_required"
	Block               Policy = "block"
)

// Tier is one entry of risk_levels.
type Tier struct {
	Name        string
	Description string
	Policy      Policy
}

// Classification is one entry of classifications: grants matching any of
// Patterns belong to tier Risk.
type Classification struct {
	Risk        string
	Patterns    []*permissions.Pattern
	Description string
}

// Table is a loaded capability_risk.yaml: Rye's format (risk_levels,
// ordered classifications) plus capgate's tool_levels, which maps each tool
// Level to a tier.
type Table struct {
	Name            string // the file it came from, for messages
	Tiers           []Tier // in file order
	Classifications []Classification
	ToolLevels      map[Level]string
}

// defaultToolLevels applies where the file's tool_levels does not say.
var defaultToolLevels = map[Level]string{Low: "safe", Med: "write", High: "elevated", Critical: "unrestricted"}

// LoadTable reads an operator's risk file. It replaces the default whole.
func LoadTable(path string) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseTable(path, data)
}

// ParseTable reads a risk file. Unknown keys are errors; every error names
// the file, the line and the key.
func ParseTable(name string, data []byte) (*Table, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t := &Table{Name: name, ToolLevels: map[Level]string{}}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty file: risk_levels and classifications are required", name)
	}
	p := &tableParser{name: name}
	root := doc.Content[0]
	var levels, classes, toolLevels *yaml.Node
	err := p.mapping(root, "", func(key string, v *yaml.Node) error {
		switch key {
		case "category", "tool_type", "version", "description", "schema_version":
			_, err := p.scalar(v, key) // Rye's metadata, kept for compatibility
			return err
		case "risk_levels":
			levels = v
		case "classifications":
			classes = v
		case "tool_levels":
			toolLevels = v
		default:
			return p.errorf(v, key, "unknown key; valid keys are risk_levels, classifications, tool_levels, category, tool_type, version, description, schema_version")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if levels == nil {
		return nil, p.errorf(root, "risk_levels", "required")
	}
	if err := p.tiers(t, levels); err != nil {
		return nil, err
	}
	if classes == nil {
		return nil, p.errorf(root, "classifications", "required")
	}
	if err := p.classifications(t, classes); err != nil {
		return nil, err
	}
	if err := p.toolLevels(t, toolLevels, root); err != nil {
		return nil, err
	}
	return t, nil
}

type tableParser struct{ name string }

func (p *tableParser) errorf(n *yaml.Node, key, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s: %s", p.name, n.Line, key, fmt.Sprintf(format, args...))
}

func (p *tableParser) mapping(n *yaml.Node, path string, each func(string, *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		if path == "" {
			return fmt.Errorf("%s:%d: the file must be a mapping of keys", p.name, n.Line)
		}
		return p.errorf(n, path, "must be a mapping")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		full := k
		if path != "" {
			full = path + "." + k
		}
		if seen[k] {
			return p.errorf(n.Content[i], full, "duplicate key")
		}
		seen[k] = true
		if err := each(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (p *tableParser) scalar(n *yaml.Node, key string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", p.errorf(n, key, "must be a single value")
	}
	return n.Value, nil
}

func (p *tableParser) tiers(t *Table, n *yaml.Node) error {
	err := p.mapping(n, "risk_levels", func(name string, v *yaml.Node) error {
		key := "risk_levels." + name
		tier := Tier{Name: name}
		err := p.mapping(v, key, func(k string, f *yaml.Node) error {
			s, err := p.scalar(f, key+"."+k)
			if err != nil {
				return err
			}
			switch k {
			case "description":
				tier.Description = s
			case "policy":
				tier.Policy = Policy(s)
				if !slices.Contains([]Policy{Allow, AcknowledgeRequired, Block}, tier.Policy) {
					return p.errorf(f, key+".policy", "unknown policy %q; valid policies are allow, acknowledge_required, block", s)
				}
			default:
				return p.errorf(f, key+"."+k, "unknown key; valid keys are description, policy")
			}
			return nil
		})
		if err != nil {
			return err
		}
		if tier.Policy == "" {
			return p.errorf(v, key+".policy", "required (allow, acknowledge_required or block)")
		}
		t.Tiers = append(t.Tiers, tier)
		return nil
	})
	if err != nil {
		return err
	}
	if len(t.Tiers) == 0 {
		return p.errorf(n, "risk_levels", "must name at least one tier")
	}
	return nil
}

func (p *tableParser) classifications(t *Table, n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, "classifications", "must be a list")
	}
	for i, item := range n.Content {
		key := fmt.Sprintf("classifications[%d]", i)
		var c Classification
		var sawPatterns bool
		err := p.mapping(item, key, func(k string, f *yaml.Node) error {
			switch k {
			case "risk":
				s, err := p.scalar(f, key+".risk")
				if err != nil {
					return err
				}
				if _, ok := t.Tier(s); !ok {
					return p.errorf(f, key+".risk", "unknown tier %q; tiers are %s", s, strings.Join(t.TierNames(), ", "))
				}
				c.Risk = s
			case "description":
				s, err := p.scalar(f, key+".description")
				if err != nil {
					return err
				}
				c.Description = s
			case "patterns":
				sawPatterns = true
				if f.Kind != yaml.SequenceNode || len(f.Content) == 0 {
					return p.errorf(f, key+".patterns", "must be a non-empty list of capability patterns")
				}
				for j, pn := range f.Content {
					s, err := p.scalar(pn, fmt.Sprintf("%s.patterns[%d]", key, j))
					if err != nil {
						return err
					}
					g, err := permissions.ParseGrant(s)
					if err != nil {
						return p.errorf(pn, fmt.Sprintf("%s.patterns[%d]", key, j), "%v", err)
					}
					c.Patterns = append(c.Patterns, permissions.Compile(g.String()))
				}
			default:
				return p.errorf(f, key+"."+k, "unknown key; valid keys are risk, patterns, description")
			}
			return nil
		})
		if err != nil {
			return err
		}
		if c.Risk == "" {
			return p.errorf(item, key+".risk", "required")
		}
		if !sawPatterns {
			return p.errorf(item, key+".patterns", "required")
		}
		t.Classifications = append(t.Classifications, c)
	}
	return nil
}

func (p *tableParser) toolLevels(t *Table, n, root *yaml.Node) error {
	if n != nil {
		err := p.mapping(n, "tool_levels", func(k string, v *yaml.Node) error {
			l, err := ParseLevel(k)
			if err != nil {
				return p.errorf(v, "tool_levels."+k, "%v", err)
			}
			s, err := p.scalar(v, "tool_levels."+k)
			if err != nil {
				return err
			}
			if _, ok := t.Tier(s); !ok {
				return p.errorf(v, "tool_levels."+k, "unknown tier %q; tiers are %s", s, strings.Join(t.TierNames(), ", "))
			}
			t.ToolLevels[l] = s
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, l := range Levels {
		if _, ok := t.ToolLevels[l]; ok {
			continue
		}
		def := defaultToolLevels[l]
		if _, ok := t.Tier(def); !ok {
			at := root
			if n != nil {
				at = n
			}
			return p.errorf(at, "tool_levels."+l.String(), "required: the default tier %q is not in risk_levels", def)
		}
		t.ToolLevels[l] = def
	}
	return nil
}

// Tier returns the tier called name.
func (t *Table) Tier(name string) (Tier, bool) {
	for _, tier := range t.Tiers {
		if tier.Name == name {
			return tier, true
		}
	}
	return Tier{}, false
}

// TierNames lists the tiers in file order.
func (t *Table) TierNames() []string {
	out := make([]string, len(t.Tiers))
	for i, tier := range t.Tiers {
		out[i] = tier.Name
	}
	return out
}

// ToolTier returns the tier a tool of level l belongs to.
func (t *Table) ToolTier(l Level) (Tier, error) {
	name, ok := t.ToolLevels[l]
	if !ok {
		return Tier{}, fmt.Errorf("no tier for risk level %q", l)
	}
	tier, _ := t.Tier(name)
	return tier, nil
}

// Class is the classification of one grant.
type Class struct {
	Tier        Tier
	Pattern     string // the classification pattern that matched
	Description string
	Classified  bool
	// Widened is set when the grant was classified as the broader grant it
	// amounts to (see Classify).
	Widened string
}

// ryePrefix starts every capability string.
const ryePrefix = "rye."

// Classify finds the tier of a grant as Rye does: the classification
// pattern that matches the grant with the most dots wins, ties go to the
// earlier entry, and no match means unclassified.
//
// One deliberate difference: a grant with a wildcard before its end is
// classified as its literal prefix followed by '*', because everything
// after the first wildcard can be anything. Without that, a grant such as
// "rye.execute.tool.*.*.*" would take the tier of a narrow pattern that
// happens to match its text, and "*" would escape "rye.*" altogether.
func (t *Table) Classify(grant string) Class {
	g, err := permissions.ParseGrant(grant)
	if err != nil {
		return Class{}
	}
	subject := g.String()
	pat := permissions.Compile(subject)
	var widened string
	if !pat.Literal() {
		prefix := pat.Prefix()
		if len(prefix) < len(ryePrefix) && strings.HasPrefix(ryePrefix, prefix) {
			prefix = ryePrefix // "*", "r*", "rye*" may match every capability
		}
		if w := prefix + "*"; w != subject {
			widened, subject = w, w
		}
	}
	best, bestDots := -1, -1
	var bestPat string
	for i, c := range t.Classifications {
		for _, p := range c.Patterns {
			if !p.Match(subject) {
				continue
			}
			if d := strings.Count(p.String(), "."); d > bestDots {
				best, bestDots, bestPat = i, d, p.String()
			}
		}
	}
	if best < 0 {
		return Class{Widened: widened}
	}
	c := t.Classifications[best]
	tier, _ := t.Tier(c.Risk)
	return Class{Tier: tier, Pattern: bestPat, Description: c.Description, Classified: true, Widened: widened}
}
