package config

import (
	"bytes"
	"fmt"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// takeSkillDirs takes Ash's `[skills] dirs = [...]` (directories of
// installed skills) out of data before the strict decode, which would read
// `dirs` as a skill named "dirs". The key and its value are blanked with
// spaces, newlines kept, so every later error keeps its line. It returns
// the directories and the data without the key; a document the parser
// refuses is left to the strict decode, which words the error.
func takeSkillDirs(name string, data []byte) (dirs []string, rest []byte, err error) {
	var p unstable.Parser
	p.Reset(data)
	table := ""
	var found *unstable.Range
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = joinKey(&p, e.Key())
		case unstable.KeyValue:
			if k := joinKey(&p, e.Key()); (table == "skills" && k == "dirs") || (table == "" && k == "skills.dirs") {
				r := e.Raw
				found = &r
			}
		}
	}
	if p.Error() != nil || found == nil {
		return nil, data, nil
	}
	line := 1 + bytes.Count(data[:found.Offset], []byte("\n"))
	kv := p.Raw(*found)
	var v struct {
		Dirs []string `toml:"dirs"`
	}
	if err := toml.Unmarshal(append([]byte("dirs"), kv[bytes.IndexByte(kv, '='):]...), &v); err != nil {
		return nil, nil, fmt.Errorf("%s:%d: skills.dirs: want a list of directories (strings)", name, line)
	}
	rest = bytes.Clone(data)
	for i := found.Offset; i < found.Offset+found.Length; i++ {
		if rest[i] != '\n' {
			rest[i] = ' '
		}
	}
	return v.Dirs, rest, nil
}

// joinKey is a key's parts joined with dots.
func joinKey(p *unstable.Parser, it unstable.Iterator) string {
	var b []byte
	for it.Next() {
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, it.Node().Data...)
	}
	return string(b)
}
