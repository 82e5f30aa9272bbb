package permissions

import (
	"fmt"
	"strings"
)

// Primary is the verb of a capability string.
type Primary string

const (
	Execute Primary = "execute" // call it
	Fetch   Primary = "fetch"   // see it listed
	Sign    Primary = "sign"    // reserved
)

// ItemType is the kind of item a capability string is about.
type ItemType string

const (
	Tool      ItemType = "tool"
	Directive ItemType = "directive" // skills and prompts
	Knowledge ItemType = "knowledge" // resources
)

// Primaries and ItemTypes list the valid words, in the order messages show.
var (
	Primaries = []Primary{Execute, Fetch, Sign}
	ItemTypes = []ItemType{Tool, Directive, Knowledge}
)

// ParsePrimary reads a primary, naming the valid ones when it is not one.
func ParsePrimary(s string) (Primary, error) {
	for _, p := range Primaries {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown primary %q: valid primaries are %s", s, joinWords(Primaries))
}

// ParseItemType reads an item type, naming the valid ones when it is not one.
func ParseItemType(s string) (ItemType, error) {
	for _, t := range ItemTypes {
		if string(t) == s {
			return t, nil
		}
	}
	return "", fmt.Errorf("unknown item type %q: valid item types are %s", s, joinWords(ItemTypes))
}

func joinWords[T ~string](words []T) string {
	s := make([]string, len(words))
	for i, w := range words {
		s[i] = string(w)
	}
	return strings.Join(s, ", ")
}

// dotted replaces the separators of item ids and grants with dots.
var dotted = strings.NewReplacer("/", ".", ":", ".")

// Required builds the capability string that doing primary on the item
// itemID of itemType requires: rye.<primary>.<item_type>.<item_id_dotted>,
// where ':' and '/' in the id become '.'. With no id it is
// rye.<primary>.<item_type>.
func Required(p Primary, t ItemType, itemID string) string {
	if itemID == "" {
		return "rye." + string(p) + "." + string(t)
	}
	// One allocation, where concatenating dotted.Replace's result takes three.
	var b strings.Builder
	b.Grow(len("rye...") + len(p) + len(t) + len(itemID))
	b.WriteString("rye.")
	b.WriteString(string(p))
	b.WriteByte('.')
	b.WriteString(string(t))
	b.WriteByte('.')
	for {
		i := strings.IndexAny(itemID, ":/")
		if i < 0 {
			break
		}
		b.WriteString(itemID[:i])
		b.WriteByte('.')
		itemID = itemID[i+1:]
	}
	b.WriteString(itemID)
	return b.String()
}
