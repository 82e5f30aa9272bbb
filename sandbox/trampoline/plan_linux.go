//go:build linux

package trampoline

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The plan travels in a format of its own, not JSON: encoding/json
// imports package strings, whose turn in capgate's package init order
// comes late (see doc.go). Each field, in the order fields lists them, is
// a uvarint (a length, a count, a bool, an unsigned number), a varint (an
// int) or bytes; a version byte leads, so that a trampoline binary
// replaced on disk while capgate runs refuses a plan it would misread.
const planVersion = 1

// fields walks every field of the plan, for both directions: one list, so
// that the encoder and the decoder cannot disagree. TestPlanRoundTrip
// fails when a field is left out of it.
func (p *Plan) fields(c codec) {
	c.str(&p.Path)
	c.strs(&p.Argv)
	c.strs(&p.Env)
	c.str(&p.Dir)
	c.flag(&p.Landlock)
	c.u64(&p.HandledFS)
	c.u64(&p.HandledNet)
	c.u64(&p.Scoped)
	c.u32(&p.RestrictFlags)
	c.strs(&p.ReadDirs)
	c.strs(&p.ReadFiles)
	c.strs(&p.WriteDirs)
	c.strs(&p.WriteFiles)
	c.flag(&p.NoTCP)
	c.flag(&p.NoSocket)
	c.flag(&p.NoFork)
	c.flag(&p.NoUnix)
	c.flag(&p.Notify)
	c.u64s(&p.Filter)
	c.flag(&p.SetUser)
	c.num(&p.UID)
	c.num(&p.GID)
	c.num(&p.Alive)
	c.str(&p.AuditTag)
}

type codec interface {
	str(*string)
	strs(*[]string)
	flag(*bool)
	num(*int)
	u32(*uint32)
	u64(*uint64)
	u64s(*[]uint64)
}

// Encode is the plan as the trampoline reads it (DecodePlan).
func (p Plan) Encode() []byte {
	e := &encoder{b: []byte{planVersion}}
	p.fields(e)
	return e.b
}

// DecodePlan reads what Encode wrote, all of it and nothing else.
func DecodePlan(b []byte) (Plan, error) {
	var p Plan
	if len(b) == 0 || b[0] != planVersion {
		return p, errors.New("not a plan of this capgate's (was its binary replaced while it ran?)")
	}
	d := &decoder{b: b[1:]}
	p.fields(d)
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes past its end", len(d.b))
	}
	if d.err != nil {
		return Plan{}, fmt.Errorf("a malformed plan: %w", d.err)
	}
	return p, nil
}

type encoder struct{ b []byte }

func (e *encoder) uv(v uint64)   { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) str(s *string) { e.uv(uint64(len(*s))); e.b = append(e.b, *s...) }
func (e *encoder) num(n *int)    { e.b = binary.AppendVarint(e.b, int64(*n)) }
func (e *encoder) u32(v *uint32) { e.uv(uint64(*v)) }
func (e *encoder) u64(v *uint64) { e.uv(*v) }
func (e *encoder) flag(v *bool) {
	if *v {
		e.uv(1)
	} else {
		e.uv(0)
	}
}

func (e *encoder) strs(v *[]string) {
	e.uv(uint64(len(*v)))
	for i := range *v {
		e.str(&(*v)[i])
	}
}

func (e *encoder) u64s(v *[]uint64) {
	e.uv(uint64(len(*v)))
	for _, x := range *v {
		e.uv(x)
	}
}

// decoder reads until its first error, then reads nothing more.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uv() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("a number cut short or too long")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count is a length or count, each of whose items takes a byte at least:
// one larger than what is left is malformed (and allocates nothing).
func (d *decoder) count() int {
	n := d.uv()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = fmt.Errorf("a length of %d with %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) str(s *string) {
	n := d.count()
	*s, d.b = string(d.b[:n]), d.b[n:]
}

func (d *decoder) strs(v *[]string) {
	n := d.count()
	if n == 0 {
		*v = nil
		return
	}
	*v = make([]string, n)
	for i := range *v {
		d.str(&(*v)[i])
	}
}

func (d *decoder) flag(v *bool) {
	switch d.uv() {
	case 0:
		*v = false
	case 1:
		*v = true
	default:
		if d.err == nil {
			d.err = errors.New("a flag neither 0 nor 1")
		}
	}
}

func (d *decoder) num(n *int) {
	if d.err != nil {
		return
	}
	v, k := binary.Varint(d.b)
	if k <= 0 || int64(int(v)) != v {
		d.err = errors.New("a number cut short or too long")
		return
	}
	*n, d.b = int(v), d.b[k:]
}

func (d *decoder) u32(v *uint32) {
	x := d.uv()
	if x > 1<<32-1 && d.err == nil {
		d.err = fmt.Errorf("%d does not fit 32 bits", x)
	}
	*v = uint32(x)
}

func (d *decoder) u64(v *uint64) { *v = d.uv() }

func (d *decoder) u64s(v *[]uint64) {
	n := d.count()
	if n == 0 {
		*v = nil
		return
	}
	*v = make([]uint64, n)
	for i := range *v {
		(*v)[i] = d.uv()
	}
}
