//go:build linux

package trampoline

import (
	"reflect"
	"strings"
	"testing"
)

// full is a plan with every field set, to a value unlike its zero.
func full(t *testing.T) Plan {
	t.Helper()
	var p Plan
	v := reflect.ValueOf(&p).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		name := v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.String:
			f.SetString(name + " ünïcode\x00")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int:
			f.SetInt(-int64(i) - 1)
		case reflect.Uint32:
			f.SetUint(1<<32 - 1 - uint64(i))
		case reflect.Uint64:
			f.SetUint(1<<64 - 1 - uint64(i))
		case reflect.Slice:
			switch f.Type().Elem().Kind() {
			case reflect.String:
				f.Set(reflect.ValueOf([]string{name, "", strings.Repeat("x", 300)}))
			case reflect.Uint64:
				f.Set(reflect.ValueOf([]uint64{0, 1<<64 - 1, uint64(i)}))
			default:
				t.Fatalf("Plan.%s: a %s, which the test cannot fill", name, f.Type())
			}
		default:
			t.Fatalf("Plan.%s: a %s, which the test cannot fill", name, f.Type())
		}
	}
	return p
}

// TestPlanRoundTrip: the trampoline reads back every field the launcher
// wrote; a field fields leaves out comes back zero and fails this.
func TestPlanRoundTrip(t *testing.T) {
	for _, p := range []Plan{full(t), {Alive: -1}} {
		got, err := DecodePlan(p.Encode())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, p) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, p)
		}
	}
}

// TestDecodePlanRefusesMalformed: a plan cut anywhere, with bytes past
// its end, of another version (a JSON plan of an older capgate), or with
// a flag not 0 or 1, is refused, not read as something else.
func TestDecodePlanRefusesMalformed(t *testing.T) {
	b := full(t).Encode()
	for n := range len(b) {
		if _, err := DecodePlan(b[:n]); err == nil {
			t.Fatalf("a plan cut to %d of its %d bytes was read", n, len(b))
		}
	}
	if _, err := DecodePlan(append(b[:len(b):len(b)], 0)); err == nil || !strings.Contains(err.Error(), "past its end") {
		t.Errorf("a plan with a byte past its end: %v", err)
	}
	if _, err := DecodePlan([]byte(`{"path":"/bin/true"}`)); err == nil || !strings.Contains(err.Error(), "not a plan") {
		t.Errorf("a JSON plan: %v", err)
	}
	p := Plan{Path: "/bin/true"}
	b = p.Encode()
	b[len(b)-5] = 2 // SetUser, before UID, GID, Alive and AuditTag (one byte each)
	if _, err := DecodePlan(b); err == nil || !strings.Contains(err.Error(), "flag") {
		t.Errorf("a flag of 2: %v", err)
	}
}
