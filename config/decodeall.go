package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// decodeAll decodes data into c strictly and goes on past each value of
// the wrong type, so that one run reports every such problem: the
// expression holding it is blanked (newlines kept, so every later error
// keeps its line) and the decode tried again. A syntax error ends it (the
// rest of the file cannot be read reliably). It returns the problems, the
// data last decoded and that decode's error: nil, or the unknown keys
// (*toml.StrictMissingError), which the caller words.
func decodeAll(name string, data []byte, c *Config) (problems []error, rest []byte, last error) {
	fresh := *c
	var p unstable.Parser
	p.Reset(data)
	for p.NextExpression() {
	}
	syntax := p.Error() != nil
	for range 200 {
		*c = fresh
		dec := toml.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err := dec.Decode(c)
		var strict *toml.StrictMissingError
		var de *toml.DecodeError
		if err == nil || errors.As(err, &strict) || syntax || !errors.As(err, &de) {
			return problems, data, err
		}
		row, col := de.Position()
		span, index, ok := enclosing(data, offset(data, row, col))
		if !ok {
			return problems, data, err
		}
		problems = append(problems, elementError(decodeError(name, err), de.Key(), index))
		data = blank(data, span)
	}
	return problems, data, errors.New("too many problems")
}

// elementError names a list's element in a problem with it: the key gets
// its index (the line is already the element's).
func elementError(err error, key []string, index int) error {
	if index < 0 || len(key) == 0 {
		return err
	}
	k := ": " + strings.Join(key, ".")
	return errors.New(strings.Replace(err.Error(), k+": ", fmt.Sprintf("%s[%d]: ", k, index), 1))
}

// offset is the byte offset of the 1-based row and column in data.
func offset(data []byte, row, col int) int {
	off := 0
	for r := 1; r < row; r++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return len(data)
		}
		off += i + 1
	}
	return min(off+col-1, len(data))
}

// blank replaces data[span] with spaces, keeping its newlines.
func blank(data []byte, span unstable.Range) []byte {
	out := bytes.Clone(data)
	for i := int(span.Offset); i < int(span.Offset+span.Length) && i < len(out); i++ {
		if out[i] != '\n' {
			out[i] = ' '
		}
	}
	return out
}

// enclosing finds what to blank for a problem at off: the key/value that
// holds it (index: the element of its list, else -1), or a table header
// with its whole section.
func enclosing(data []byte, off int) (span unstable.Range, index int, ok bool) {
	var p unstable.Parser
	p.Reset(data)
	header := -1 // the start of the current table's header line
	for p.NextExpression() {
		e := p.Expression()
		start := lineStart(data, exprStart(e))
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			if header >= 0 && off >= header && off < start {
				return unstable.Range{Offset: uint32(header), Length: uint32(start - header)}, -1, true
			}
			header = -1
			if end := lineEnd(data, start); off >= start && off < end {
				header = start
			}
		case unstable.KeyValue:
			if r := e.Raw; off >= int(r.Offset) && off < int(r.Offset+r.Length) {
				return r, elementAt(e.Value(), off), true
			}
		}
	}
	if header >= 0 {
		return unstable.Range{Offset: uint32(header), Length: uint32(len(data) - header)}, -1, true
	}
	return unstable.Range{}, -1, false
}

// exprStart is where an expression begins: its first key part.
func exprStart(e *unstable.Node) int {
	it := e.Key()
	if it.Next() {
		return int(it.Node().Raw.Offset)
	}
	return int(e.Raw.Offset)
}

// elementAt is the index of v's element (v a list) that holds off, or -1.
func elementAt(v *unstable.Node, off int) int {
	if v == nil || v.Kind != unstable.Array {
		return -1
	}
	i := 0
	for it := v.Children(); it.Next(); i++ {
		n := it.Node()
		if r := n.Raw; r.Length > 0 && off >= int(r.Offset) && off < int(r.Offset+r.Length) {
			return i
		}
	}
	return -1
}

func lineStart(data []byte, off int) int {
	return bytes.LastIndexByte(data[:min(off, len(data))], '\n') + 1
}

func lineEnd(data []byte, off int) int {
	if i := bytes.IndexByte(data[off:], '\n'); i >= 0 {
		return off + i
	}
	return len(data)
}

// KeyLine is the 1-based line of src where key is set: a dotted key as
// config's messages name it (policy.grants, policy.grants[2] for a list's
// element, mcp.servers.fs.command, policy.side_effects."fs.delete"), or
// the header of the nearest table holding it when the key is not written
// itself; 0 when neither is in src.
func KeyLine(src []byte, key string) int {
	want, index := splitKey(key)
	var p unstable.Parser
	p.Reset(src)
	var table []string
	header, depth := 0, 0
	line := func(off uint32) int { return 1 + bytes.Count(src[:off], []byte("\n")) }
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = keyParts(e.Key())
			// The nearest table holding the key: its own, else its parent's.
			if n := len(table); n <= len(want) && n > depth && slices.Equal(table, want[:n]) {
				header, depth = line(uint32(exprStart(e))), n
			}
		case unstable.KeyValue:
			full := append(append([]string{}, table...), keyParts(e.Key())...)
			if slices.Equal(full, want) {
				if index >= 0 {
					if n := nth(e.Value(), index); n != nil && n.Raw.Length > 0 {
						return line(n.Raw.Offset)
					}
				}
				return line(uint32(exprStart(e)))
			}
			// A key inside an inline table: its own key/value node.
			if n := inline(e.Value(), full, want); n != nil {
				return line(uint32(exprStart(n)))
			}
		}
	}
	return header
}

// inline finds the key/value of want inside v, an inline table at path.
func inline(v *unstable.Node, path, want []string) *unstable.Node {
	if v == nil || v.Kind != unstable.InlineTable || len(want) <= len(path) || !slices.Equal(path, want[:len(path)]) {
		return nil
	}
	for it := v.Children(); it.Next(); {
		kv := it.Node()
		full := append(append([]string{}, path...), keyParts(kv.Key())...)
		if slices.Equal(full, want) {
			return kv
		}
		if n := inline(kv.Value(), full, want); n != nil {
			return n
		}
	}
	return nil
}

func nth(v *unstable.Node, index int) *unstable.Node {
	if v == nil || v.Kind != unstable.Array {
		return nil
	}
	i := 0
	for it := v.Children(); it.Next(); i++ {
		if i == index {
			return it.Node()
		}
	}
	return nil
}

func keyParts(it unstable.Iterator) []string {
	var out []string
	for it.Next() {
		out = append(out, string(it.Node().Data))
	}
	return out
}

// splitKey reads a key as config's messages write it: dotted parts, a
// part quoted when it holds a dot, and a trailing [N] for a list element.
func splitKey(key string) (parts []string, index int) {
	index = -1
	if i := strings.LastIndexByte(key, '['); i > 0 && strings.HasSuffix(key, "]") {
		var n int
		if _, err := fmt.Sscanf(key[i:], "[%d]", &n); err == nil {
			key, index = key[:i], n
		}
	}
	var cur strings.Builder
	quoted := false
	for _, r := range key {
		switch {
		case r == '"':
			quoted = !quoted
		case r == '.' && !quoted:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(parts, cur.String()), index
}

// knownKeys are the keys the config allows under path (its struct's
// fields), for "did you mean"; nil where any key goes (a map's names).
func knownKeys(path []string) []string {
	t := reflect.TypeFor[Config]()
	for _, part := range path {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Map:
			t = t.Elem()
		case reflect.Struct:
			f, ok := fieldByTag(t, part)
			if !ok {
				return nil
			}
			t = f.Type
		default:
			return nil
		}
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		if tag := tomlName(t.Field(i)); tag != "" {
			out = append(out, tag)
		}
	}
	return out
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if tomlName(t.Field(i)) == name {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

func tomlName(f reflect.StructField) string {
	tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	return tag
}
