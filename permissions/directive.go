package permissions

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Permissions is what a directive's <permissions> block declares.
type Permissions struct {
	Grants      []string          // capability strings, in the order written
	Acknowledge []Acknowledgement // tiers the directive acknowledges
	Line        int               // line of <permissions> in the source
}

// Acknowledgement is one <acknowledge> element.
type Acknowledgement struct {
	Tier   string
	Reason string
	Line   int
}

// Tiers returns the acknowledged tier names.
func (p *Permissions) Tiers() []string {
	out := make([]string, len(p.Acknowledge))
	for i, a := range p.Acknowledge {
		out[i] = a.Tier
	}
	return out
}

// ErrNoPermissions is returned by ParseDirective when the text has no
// <permissions> block.
var ErrNoPermissions = errors.New("no <permissions> block")

// permissionTags are the valid children of <permissions>, as messages list them.
var permissionTags = []string{"acknowledge", "execute", "fetch", "sign"}

// formerPrimaries are Rye's older names, which get a hint rather than a bare
// "unknown tag".
var formerPrimaries = map[string]Primary{"search": Fetch, "load": Fetch}

// ParseDirective finds the <permissions> block in a directive (any text
// file, typically markdown with the block in an xml fence) and reads it.
// name is used in error messages, which read "name:line: ...".
//
//	<permissions>
//	  <execute><tool>mcp.filesystem.*</tool></execute>
//	  <fetch>*</fetch>
//	  <acknowledge risk="elevated">reads the workspace</acknowledge>
//	</permissions>
//
// gives rye.execute.tool.mcp.filesystem.* and rye.fetch.*, acknowledging
// the elevated tier. <permissions>*</permissions> is rye.*.
func ParseDirective(name string, src []byte) (*Permissions, error) {
	start, end, err := findBlock(src)
	if errors.Is(err, ErrNoPermissions) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s:%w", name, err)
	}
	line0 := 1 + bytes.Count(src[:start], []byte("\n"))
	p, err := parseBlock(src[start:end], line0)
	if err != nil {
		return nil, fmt.Errorf("%s:%w", name, err)
	}
	return p, nil
}

// findBlock returns the byte range of the one <permissions> element in src.
// An occurrence right after a backquote is inline code in prose, not a block.
func findBlock(src []byte) (start, end int, err error) {
	start = -1
	for off := 0; ; {
		i := bytes.Index(src[off:], []byte("<permissions"))
		if i < 0 {
			break
		}
		i += off
		off = i + len("<permissions")
		if off < len(src) && !strings.ContainsRune(" \t\r\n/>", rune(src[off])) {
			continue // <permissionsX> is another tag
		}
		if i > 0 && src[i-1] == '`' {
			continue
		}
		if start >= 0 {
			return 0, 0, fmt.Errorf("%d: more than one <permissions> block (the first is on line %d)",
				1+bytes.Count(src[:i], []byte("\n")), 1+bytes.Count(src[:start], []byte("\n")))
		}
		start = i
		gt := bytes.IndexByte(src[i:], '>')
		if gt < 0 {
			return 0, 0, fmt.Errorf("%d: <permissions> tag is not closed", 1+bytes.Count(src[:i], []byte("\n")))
		}
		if src[i+gt-1] == '/' { // <permissions/>
			end = i + gt + 1
			off = end
			continue
		}
		j := bytes.Index(src[i:], []byte("</permissions>"))
		if j < 0 {
			return 0, 0, fmt.Errorf("%d: <permissions> has no </permissions>", 1+bytes.Count(src[:i], []byte("\n")))
		}
		end = i + j + len("</permissions>")
		off = end
	}
	if start < 0 {
		return 0, 0, ErrNoPermissions
	}
	return start, end, nil
}

// blockParser reads one <permissions> element with a strict XML decoder and
// reports errors at the line they are on.
type blockParser struct {
	d     *xml.Decoder
	line0 int
	p     *Permissions
}

func (bp *blockParser) line() int {
	l, _ := bp.d.InputPos()
	return bp.line0 + l - 1
}

func (bp *blockParser) errorf(line int, format string, args ...any) error {
	return fmt.Errorf("%d: "+format, append([]any{line}, args...)...)
}

func parseBlock(block []byte, line0 int) (*Permissions, error) {
	bp := &blockParser{d: xml.NewDecoder(bytes.NewReader(block)), line0: line0, p: &Permissions{Line: line0}}
	bp.d.Strict = true
	tok, err := bp.next()
	if err != nil {
		return nil, err
	}
	root := tok.(xml.StartElement) // findBlock guarantees it
	if err := bp.noAttrs(root, line0); err != nil {
		return nil, err
	}
	text, err := bp.children("permissions", func(el xml.StartElement, line int) error {
		switch name := el.Name.Local; name {
		case "acknowledge":
			return bp.acknowledge(el, line)
		case "execute", "fetch", "sign":
			return bp.primary(Primary(name), el, line)
		default:
			if p, ok := formerPrimaries[name]; ok {
				return bp.errorf(line, "<permissions>: unknown tag <%s> (Rye's former name; capgate calls it <%s>); valid tags: %s",
					name, p, strings.Join(permissionTags, ", "))
			}
			return bp.errorf(line, "<permissions>: unknown tag <%s>; valid tags: %s", name, strings.Join(permissionTags, ", "))
		}
	})
	if err != nil {
		return nil, err
	}
	switch text {
	case "":
	case "*":
		bp.p.Grants = append([]string{"rye.*"}, bp.p.Grants...)
	default:
		return nil, bp.errorf(line0, "<permissions>: unexpected text %q; only * (every capability) may stand there", text)
	}
	return bp.p, nil
}

// next returns the next token that is not a comment, directive or
// processing instruction.
func (bp *blockParser) next() (xml.Token, error) {
	for {
		tok, err := bp.d.Token()
		if err != nil {
			var se *xml.SyntaxError
			if errors.As(err, &se) {
				return nil, bp.errorf(bp.line0+se.Line-1, "<permissions>: %s", se.Msg)
			}
			if err == io.EOF {
				return nil, bp.errorf(bp.line(), "<permissions>: unexpected end of block")
			}
			return nil, bp.errorf(bp.line(), "<permissions>: %v", err)
		}
		switch tok.(type) {
		case xml.Comment, xml.ProcInst, xml.Directive:
			continue
		}
		return xml.CopyToken(tok), nil
	}
}

// children reads the content of the element just opened up to its end
// tag, calling child for each child element, and returns the element's own
// text, trimmed.
func (bp *blockParser) children(parent string, child func(xml.StartElement, int) error) (string, error) {
	var text strings.Builder
	for {
		line := bp.line()
		tok, err := bp.next()
		if err != nil {
			return "", err
		}
		switch t := tok.(type) {
		case xml.CharData:
			text.Write(t)
		case xml.EndElement:
			return strings.TrimSpace(text.String()), nil
		case xml.StartElement:
			if child == nil {
				return "", bp.errorf(line, "<%s> holds text only, not <%s>", parent, t.Name.Local)
			}
			if err := child(t, line); err != nil {
				return "", err
			}
		}
	}
}

func (bp *blockParser) noAttrs(el xml.StartElement, line int) error {
	if len(el.Attr) > 0 {
		return bp.errorf(line, "<%s>: unexpected attribute %s", el.Name.Local, el.Attr[0].Name.Local)
	}
	return nil
}

func (bp *blockParser) acknowledge(el xml.StartElement, line int) error {
	var tier string
	for _, a := range el.Attr {
		if a.Name.Local != "risk" {
			return bp.errorf(line, "<acknowledge>: unexpected attribute %s; the only one is risk", a.Name.Local)
		}
		tier = strings.TrimSpace(a.Value)
	}
	text, err := bp.children("acknowledge", nil)
	if err != nil {
		return err
	}
	ack := Acknowledgement{Tier: tier, Reason: text, Line: line}
	if tier == "" { // <acknowledge>elevated</acknowledge>
		ack = Acknowledgement{Tier: text, Line: line}
	}
	if ack.Tier == "" || strings.ContainsAny(ack.Tier, " \t\r\n") {
		return bp.errorf(line, "<acknowledge>: needs one tier name, as <acknowledge>elevated</acknowledge> or <acknowledge risk=\"elevated\">why</acknowledge>")
	}
	bp.p.Acknowledge = append(bp.p.Acknowledge, ack)
	return nil
}

func (bp *blockParser) primary(p Primary, el xml.StartElement, line int) error {
	if err := bp.noAttrs(el, line); err != nil {
		return err
	}
	items := 0
	text, err := bp.children(string(p), func(item xml.StartElement, line int) error {
		t, err := ParseItemType(item.Name.Local)
		if err != nil {
			return bp.errorf(line, "<%s>: unknown tag <%s>; valid tags: %s", p, item.Name.Local, joinWords(ItemTypes))
		}
		if err := bp.noAttrs(item, line); err != nil {
			return err
		}
		id, err := bp.children(item.Name.Local, nil)
		if err != nil {
			return err
		}
		if id == "" {
			return bp.errorf(line, "<%s><%s> is empty; write an item id pattern, or * for every %s", p, t, t)
		}
		items++
		// The text is an item id pattern: its ':' and '/' become '.', as in Required.
		return bp.grant(line, "rye."+string(p)+"."+string(t)+"."+dotted.Replace(id))
	})
	if err != nil {
		return err
	}
	switch {
	case text != "" && items > 0:
		return bp.errorf(line, "<%s>: text %q beside item tags; write either * or item tags", p, text)
	case text == "*":
		return bp.grant(line, "rye."+string(p)+".*")
	case text != "": // Rye's <execute>tool.mcp.*</execute> form
		return bp.grant(line, "rye."+string(p)+"."+text)
	case items == 0:
		return bp.errorf(line, "<%s> is empty; list <tool>, <directive> or <knowledge> items, or write *", p)
	}
	return nil
}

func (bp *blockParser) grant(line int, s string) error {
	g, err := ParseGrant(s)
	if err != nil {
		return bp.errorf(line, "%v", err)
	}
	bp.p.Grants = append(bp.p.Grants, g.String())
	return nil
}
