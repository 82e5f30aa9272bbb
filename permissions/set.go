package permissions

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Grant is one compiled capability pattern.
type Grant struct {
	pat *Pattern
}

// String returns the grant in canonical form ('/' read as '.').
func (g Grant) String() string { return g.pat.src }

// Match reports whether the grant allows the required capability string.
func (g Grant) Match(required string) bool { return g.pat.Match(required) }

// ParseGrant compiles one grant. A grant is any fnmatch pattern, with '/'
// read as '.'; it must not be empty and must not hold white space or
// control characters, which are always typing mistakes here.
func ParseGrant(s string) (Grant, error) {
	if s == "" {
		return Grant{}, errors.New("empty grant")
	}
	if !utf8.ValidString(s) {
		return Grant{}, fmt.Errorf("grant %q is not valid UTF-8", s)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return Grant{}, fmt.Errorf("grant %q contains white space or a control character", s)
		}
	}
	return Grant{pat: Compile(strings.ReplaceAll(s, "/", "."))}, nil
}

// Set is a compiled set of grants. It allows a capability string only when
// every one of its layers has a grant that matches: a plain set has one
// layer, Intersect stacks them. The zero Set, and a set with an empty
// layer, allow nothing: no grant means deny (fail closed).
//
// A Set is immutable once built and safe for concurrent use.
type Set struct {
	layers []*layer
}

// layer is one grant list with its literal-prefix index.
type layer struct {
	grants []Grant
	root   node
}

// NewSet compiles grants into a Set. It reports every bad grant, by
// position, in one error.
func NewSet(grants ...string) (*Set, error) {
	l := &layer{}
	var errs []error
	for i, s := range grants {
		g, err := ParseGrant(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("grant %d: %w", i+1, err))
			continue
		}
		l.add(g)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Set{layers: []*layer{l}}, nil
}

// MustSet is NewSet for grants known to be valid; it panics otherwise.
func MustSet(grants ...string) *Set {
	s, err := NewSet(grants...)
	if err != nil {
		panic(err)
	}
	return s
}

// Intersect returns the attenuation of parent by child: a capability is
// allowed only if a child grant and a parent grant both match it, so the
// result is never wider than either. A nil argument counts as no grants.
func Intersect(child, parent *Set) *Set {
	if child == nil || parent == nil || len(child.layers) == 0 || len(parent.layers) == 0 {
		return &Set{}
	}
	layers := make([]*layer, 0, len(child.layers)+len(parent.layers))
	layers = append(layers, child.layers...)
	layers = append(layers, parent.layers...)
	return &Set{layers: layers}
}

// Decision is the answer to one Check.
type Decision struct {
	Required string
	Allowed  bool
	// Matched holds, for each layer in order (the child first), the grant
	// that matched: the most specific one, that is the one with the longest
	// literal prefix, the earlier one on a tie. On a denial it holds the
	// matches of the layers before the one that refused.
	Matched []string
	// Layer is the index of the layer that refused, when denied.
	Layer int
	// Layers is how many layers the set had.
	Layers int
}

// Grant returns the grant that matched in the first layer, or "".
func (d Decision) Grant() string {
	if len(d.Matched) == 0 {
		return ""
	}
	return d.Matched[0]
}

// Reason explains the decision in one line.
func (d Decision) Reason() string {
	return reasonOf(d.Required, d.Matched, d.Allowed, d.Layers, d.Layer)
}

// reasonOf is Reason with the fields apart, so that escape analysis sees
// matched does not escape and Explain can keep it on the stack.
func reasonOf(required string, matched []string, allowed bool, layers, layer int) string {
	switch {
	case allowed && layers == 1:
		return required + " is allowed by grant " + matched[0]
	case allowed:
		return allowedByGrants(required, matched)
	case layers == 0:
		return fmt.Sprintf("%s is denied: no grants (fail closed)", required)
	case layers == 1:
		return fmt.Sprintf("%s is denied: no grant matches it", required)
	case layer == 0:
		return fmt.Sprintf("%s is denied: no grant of the attenuating (child) set matches it", required)
	default:
		return fmt.Sprintf("%s is denied: allowed by %s, but no grant of attenuation layer %d matches it",
			required, strings.Join(matched, " and "), layer+1)
	}
}

// allowedByGrants is the reason of an allowed multi-layer decision, built
// in one allocation: the router audits it on every call.
func allowedByGrants(required string, matched []string) string {
	const by, and = " is allowed by grants ", " and "
	n := len(required) + len(by)
	for i, m := range matched {
		if i > 0 {
			n += len(and)
		}
		n += len(m)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(required)
	b.WriteString(by)
	for i, m := range matched {
		if i > 0 {
			b.WriteString(and)
		}
		b.WriteString(m)
	}
	return b.String()
}

// Allows reports whether required is allowed, without building a Decision.
func (s *Set) Allows(required string) bool {
	if s == nil || len(s.layers) == 0 {
		return false
	}
	for _, l := range s.layers {
		if _, ok := l.match(required); !ok {
			return false
		}
	}
	return true
}

// Check decides whether the set allows the capability string required.
func (s *Set) Check(required string) Decision {
	if s == nil || len(s.layers) == 0 {
		return Decision{Required: required}
	}
	return s.decide(required, make([]string, 0, len(s.layers)))
}

// Explain is Check for a caller that keeps only the verdict, the layer
// that refused (when denied) and the Reason: with no Matched to hand back,
// the matches stay on the stack and only the reason is allocated.
func (s *Set) Explain(required string) (allowed bool, layer int, reason string) {
	var buf [4]string
	d := Decision{Required: required}
	if s != nil && len(s.layers) > 0 {
		d = s.decide(required, buf[:0])
	}
	return d.Allowed, d.Layer, reasonOf(required, d.Matched, d.Allowed, d.Layers, d.Layer)
}

// decide is Check for a set with layers, appending the matches to matched.
func (s *Set) decide(required string, matched []string) Decision {
	d := Decision{Required: required, Layers: len(s.layers), Matched: matched}
	for i, l := range s.layers {
		g, ok := l.match(required)
		if !ok {
			d.Layer = i
			return d
		}
		d.Matched = append(d.Matched, g.String())
	}
	d.Allowed = true
	return d
}

// The index: a radix tree over the grants' literal prefixes. A check walks
// the required string down the tree once; only the grants stored on the
// nodes it passes (those whose literal prefix is a prefix of the required
// string) are candidates, tried deepest first.

type node struct {
	label    string // the edge into this node
	children []*node
	first    []byte // first byte of each child's label, for the lookup
	grants   []int  // indexes into layer.grants whose prefix ends here
}

func (l *layer) add(g Grant) {
	idx := len(l.grants)
	l.grants = append(l.grants, g)
	n, key := &l.root, g.pat.prefix
	for key != "" {
		c := n.child(key[0])
		if c == nil {
			c = &node{label: key}
			n.children = append(n.children, c)
			n.first = append(n.first, key[0])
			n = c
			break
		}
		common := commonPrefix(c.label, key)
		if common < len(c.label) {
			// Split c: a new node for the shared part, c below it.
			mid := &node{label: c.label[:common], children: []*node{c}, first: []byte{c.label[common]}}
			c.label = c.label[common:]
			n.replace(key[0], mid)
			c = mid
		}
		n, key = c, key[common:]
	}
	n.grants = append(n.grants, idx)
}

func (n *node) child(b byte) *node {
	for i, f := range n.first {
		if f == b {
			return n.children[i]
		}
	}
	return nil
}

func (n *node) replace(b byte, c *node) {
	for i, f := range n.first {
		if f == b {
			n.children[i] = c
			return
		}
	}
}

func commonPrefix(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// match finds the most specific grant of the layer that allows required.
func (l *layer) match(required string) (Grant, bool) {
	var stackBuf [24]*node
	path := stackBuf[:0]
	n, rest := &l.root, required
	for {
		if len(n.grants) > 0 {
			path = append(path, n)
		}
		if rest == "" {
			break
		}
		c := n.child(rest[0])
		if c == nil || !strings.HasPrefix(rest, c.label) {
			break
		}
		n, rest = c, rest[len(c.label):]
	}
	for i := len(path) - 1; i >= 0; i-- {
		for _, gi := range path[i].grants {
			if g := l.grants[gi]; g.pat.Match(required) {
				return g, true
			}
		}
	}
	return Grant{}, false
}
