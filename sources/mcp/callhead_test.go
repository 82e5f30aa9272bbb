package mcp

import (
	"context"
	"net/http"
	"reflect"
	"testing"
)

// A tools/call of a 2026-07-28 link without hook headers goes with the
// header callHead made once per tool; it is the header the general path
// builds (withMoreHeaders, then newRequest), for the call's POST, for a
// resumed stream's GET, and with a hook's credential added after a refusal.
func TestCallHeadIsTheGeneralHead(t *testing.T) {
	s, l, tools := httpPaths(t)
	if !l.modern() {
		t.Fatalf("the fixture's link is at %s, not the stateless protocol", l.version)
	}
	body := []byte(`{}`)
	cred := http.Header{"Authorization": {"Bearer fresh"}}
	for name := range tools {
		general := withMoreHeaders(context.Background(), s.toolsCallHeaders(name))
		fast := context.WithValue(context.Background(), callHeadKey{}, s.callHead(l, name))
		for _, c := range []struct {
			what          string
			general, fast context.Context
			body          []byte
			resume        string
		}{
			{"POST", general, fast, body, ""},
			{"resumed GET", general, fast, nil, "ev-1"},
			{"POST with a refreshed credential", withMoreHeaders(general, cred), withMoreHeaders(fast, cred), body, ""},
			{"GET with a refreshed credential", withMoreHeaders(general, cred), withMoreHeaders(fast, cred), nil, "ev-1"},
		} {
			want, err := s.newRequest(c.general, l, c.body, c.resume)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.newRequest(c.fast, l, c.body, c.resume)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Header, want.Header) || got.Method != want.Method || got.URL.String() != want.URL.String() {
				t.Errorf("%s, %s: %s %s %v, want %s %s %v", name, c.what, got.Method, got.URL, got.Header, want.Method, want.URL, want.Header)
			}
			if name == "echo" && c.body != nil && (got.Header.Get("Mcp-Method") != "tools/call" || got.Header.Get("Mcp-Name") != "echo") {
				t.Errorf("%s: the call's standard headers are missing: %v", c.what, got.Header)
			}
		}
	}
	// The shared head is not written by a call that adds a credential.
	before := s.callHead(l, "echo").full.Clone()
	if _, err := s.newRequest(withMoreHeaders(context.WithValue(context.Background(), callHeadKey{}, s.callHead(l, "echo")), cred), l, body, ""); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.callHead(l, "echo").full, before) {
		t.Errorf("the shared head changed: %v, was %v", s.callHead(l, "echo").full, before)
	}
}
