// Package permissions implements Rye-style capability strings: the fnmatch
// matcher, compiled grant sets, attenuation by intersection and the
// <permissions> block of directives. It imports nothing else of the module.
package permissions

import (
	"strings"
	"unicode/utf8"
)

// Pattern is a compiled fnmatch pattern. Its Match equals Python's
// fnmatch.fnmatchcase on every input: '*' matches any run of characters
// (dots and newlines included), '?' one character, '[seq]' and '[!seq]' one
// character in or out of the set, with ranges. An unclosed '[' is literal;
// there are no escapes and no braces.
type Pattern struct {
	src    string
	toks   []token
	prefix string // literal characters before the first wildcard
	exact  bool   // no wildcard at all: Match is string equality
}

type tokenKind uint8

const (
	tokLiteral tokenKind = iota
	tokAny               // '?'
	tokClass             // '[...]'
	tokStar              // '*' (consecutive stars are one)
)

type token struct {
	kind tokenKind
	lit  string // tokLiteral
	cls  *class // tokClass
}

// class is one bracket expression, reduced to the set Python's regular
// expression would build from fnmatch.translate's output.
type class struct {
	negate bool
	chars  []rune
	ranges [][2]rune
}

func (c *class) match(r rune) bool {
	in := false
	for _, ch := range c.chars {
		if ch == r {
			in = true
			break
		}
	}
	if !in {
		for _, rg := range c.ranges {
			if rg[0] <= r && r <= rg[1] {
				in = true
				break
			}
		}
	}
	return in != c.negate
}

// Match reports whether pattern matches s, exactly as Python's
// fnmatch.fnmatchcase(s, pattern) would.
func Match(pattern, s string) bool {
	return Compile(pattern).Match(s)
}

// String returns the pattern as written.
func (p *Pattern) String() string { return p.src }

// Literal reports whether the pattern has no wildcard, so it matches only
// itself.
func (p *Pattern) Literal() bool { return p.exact }

// Prefix returns the literal text every match starts with.
func (p *Pattern) Prefix() string { return p.prefix }

// Match reports whether s matches the pattern.
func (p *Pattern) Match(s string) bool {
	if p.exact {
		return s == p.src
	}
	if !strings.HasPrefix(s, p.prefix) {
		return false
	}
	// Classic wildcard matching with backtracking to the last star: every
	// token but '*' consumes a fixed number of characters, so retrying only
	// the most recent star is complete and the cost stays O(len(s)·len(p)).
	toks := p.toks
	ti, si := 0, 0
	starTi, starSi := -1, 0
	for {
		if ti < len(toks) {
			t := &toks[ti]
			switch t.kind {
			case tokStar:
				starTi, starSi = ti, si
				ti++
				continue
			case tokLiteral:
				if strings.HasPrefix(s[si:], t.lit) {
					si += len(t.lit)
					ti++
					continue
				}
			case tokAny:
				if si < len(s) {
					_, n := decode(s[si:])
					si += n
					ti++
					continue
				}
			case tokClass:
				if si < len(s) {
					r, n := decode(s[si:])
					if t.cls.match(r) {
						si += n
						ti++
						continue
					}
				}
			}
		} else if si == len(s) {
			return true
		}
		// Mismatch: let the last star swallow one more character.
		if starTi < 0 || starSi >= len(s) {
			return false
		}
		_, n := decode(s[starSi:])
		starSi += n
		si, ti = starSi, starTi+1
	}
}

// invalidBase maps each byte of invalid UTF-8 to its own value outside the
// Unicode range, so it equals only the same byte and never a real character.
const invalidBase = utf8.MaxRune + 1

func decode(s string) (rune, int) {
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n <= 1 {
		return invalidBase + rune(s[0]), 1
	}
	return r, n
}

func encode(buf []byte, r rune) []byte {
	if r >= invalidBase {
		return append(buf, byte(r-invalidBase))
	}
	return utf8.AppendRune(buf, r)
}

// Compile compiles an fnmatch pattern. Every string is a valid pattern, as
// in Python, so Compile cannot fail.
func Compile(pat string) *Pattern {
	rs := make([]rune, 0, len(pat))
	for i := 0; i < len(pat); {
		r, n := decode(pat[i:])
		rs = append(rs, r)
		i += n
	}
	p := &Pattern{src: pat}
	var lit []byte
	flush := func() {
		if len(lit) > 0 {
			p.toks = append(p.toks, token{kind: tokLiteral, lit: string(lit)})
			lit = lit[:0]
		}
	}
	// This loop follows fnmatch.translate step by step.
	i, n := 0, len(rs)
	for i < n {
		c := rs[i]
		i++
		switch c {
		case '*':
			flush()
			if len(p.toks) == 0 || p.toks[len(p.toks)-1].kind != tokStar {
				p.toks = append(p.toks, token{kind: tokStar})
			}
		case '?':
			flush()
			p.toks = append(p.toks, token{kind: tokAny})
		case '[':
			j := i
			if j < n && rs[j] == '!' {
				j++
			}
			if j < n && rs[j] == ']' {
				j++
			}
			for j < n && rs[j] != ']' {
				j++
			}
			if j >= n {
				lit = encode(lit, '[') // unclosed: a literal bracket
				continue
			}
			flush()
			p.toks = append(p.toks, token{kind: tokClass, cls: parseClass(rs, i, j)})
			i = j + 1
		default:
			lit = encode(lit, c)
		}
	}
	flush()
	if len(p.toks) == 0 || (len(p.toks) == 1 && p.toks[0].kind == tokLiteral) {
		p.exact = true
	}
	if len(p.toks) > 0 && p.toks[0].kind == tokLiteral {
		p.prefix = p.toks[0].lit
	}
	return p
}

// parseClass reduces the bracket expression rs[i:j] (between '[' and ']') to
// the set Python matches. It replays fnmatch.translate's chunking, which
// drops reversed ranges, and then reads the result the way Python's regular
// expression parser reads the class it emits.
func parseClass(rs []rune, i, j int) *class {
	hasHyphen := false
	for _, r := range rs[i:j] {
		if r == '-' {
			hasHyphen = true
			break
		}
	}
	var chunks [][]rune
	if !hasHyphen {
		chunks = [][]rune{append([]rune(nil), rs[i:j]...)}
	} else {
		k := i + 1
		if rs[i] == '!' {
			k = i + 2
		}
		for {
			k = indexRune(rs, '-', k, j)
			if k < 0 {
				break
			}
			chunks = append(chunks, append([]rune(nil), rs[i:k]...))
			i = k + 1
			k += 3
		}
		if chunk := rs[i:j]; len(chunk) > 0 {
			chunks = append(chunks, append([]rune(nil), chunk...))
		} else {
			last := len(chunks) - 1
			chunks[last] = append(chunks[last], '-')
		}
		// Remove empty (reversed) ranges, as translate does.
		for k := len(chunks) - 1; k > 0; k-- {
			prev, cur := chunks[k-1], chunks[k]
			if prev[len(prev)-1] > cur[0] {
				merged := append(append([]rune(nil), prev[:len(prev)-1]...), cur[1:]...)
				chunks[k-1] = merged
				chunks = append(chunks[:k], chunks[k+1:]...)
			}
		}
	}
	c := &class{}
	// An empty set never matches; "[!" over an empty set matches anything.
	if len(chunks) == 1 && len(chunks[0]) == 0 {
		return c
	}
	if chunks[0][0] == '!' {
		c.negate = true
		chunks[0] = chunks[0][1:]
	}
	// The regex is the chunks joined by range hyphens, every other character
	// escaped to a literal. Read it as Python's sre_parse does.
	type atom struct {
		r      rune
		hyphen bool // a joining hyphen, not an escaped literal '-'
	}
	var atoms []atom
	for k, ch := range chunks {
		if k > 0 {
			atoms = append(atoms, atom{r: '-', hyphen: true})
		}
		for _, r := range ch {
			atoms = append(atoms, atom{r: r})
		}
	}
	for x := 0; x < len(atoms); {
		lo := atoms[x].r
		x++
		if x < len(atoms) && atoms[x].hyphen {
			x++
			if x >= len(atoms) {
				c.chars = append(c.chars, lo, '-')
				break
			}
			hi := atoms[x].r
			x++
			if hi < lo {
				// Python would fail to compile; translate never emits this.
				return &class{}
			}
			c.ranges = append(c.ranges, [2]rune{lo, hi})
			continue
		}
		c.chars = append(c.chars, lo)
	}
	return c
}

func indexRune(rs []rune, r rune, from, to int) int {
	for k := from; k < to; k++ {
		if rs[k] == r {
			return k
		}
	}
	return -1
}
