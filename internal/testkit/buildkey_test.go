package testkit

import "testing"

// TestBuildKey: a program's key names every package it is made of and
// nothing else, so a batched go list gives each program the key a go list
// of it alone would, and a change in any of its packages is a new key.
func TestBuildKey(t *testing.T) {
	l := &listing{
		ids:  map[string]string{"m": "m1", "a": "a1", "b": "b1", "other": "o1"},
		deps: map[string][]string{"m": {"a", "b"}, "a": {"b"}, "b": nil, "other": nil},
	}
	alone := &listing{ids: map[string]string{"m": "m1", "a": "a1", "b": "b1"}, deps: map[string][]string{"m": {"a", "b"}}}
	want := l.key("m")
	if want == "" || alone.key("m") != want {
		t.Fatalf("key of m: %q in a batch, %q alone", want, alone.key("m"))
	}
	l.ids["other"] = "o2"
	if l.key("m") != want {
		t.Error("a package m is not made of changed m's key")
	}
	for _, p := range []string{"m", "a", "b"} {
		old := l.ids[p]
		l.ids[p] = old + "-changed"
		if l.key("m") == want {
			t.Errorf("m's key did not change with %s's build id", p)
		}
		l.ids[p] = old
	}
	if k := l.key("missing"); k != "" {
		t.Errorf("the key of a package go list did not list: %q, want none", k)
	}
}
