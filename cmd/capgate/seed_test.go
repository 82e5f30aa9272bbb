package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCapabilityListGroupChat: capability.list, through the real CLI and
// a real serve, lists a group-chat caller only what it may call; asked
// for unavailable ones too, it shows the sensitive capability as
// unavailable with the chat gate's reason. A private chat sees it callable.
func TestCapabilityListGroupChat(t *testing.T) {
	s := startServe(t, "")
	type entry struct {
		ID                string
		Available         bool
		UnavailableReason string `json:"unavailable_reason"`
	}
	list := func(tok string, args ...string) map[string]entry {
		t.Helper()
		out, errb, code := s.as(t, tok, append([]string{"list"}, args...)...)
		var res struct{ Capabilities []entry }
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("list %v: %d %s %s", args, code, out, errb)
		}
		m := map[string]entry{}
		for _, c := range res.Capabilities {
			m[c.ID] = c
		}
		return m
	}
	group := s.mint(t, "alice", "group")
	if got := list(group); len(got) == 0 {
		t.Fatal("a group caller sees nothing")
	} else if _, ok := got["gog.email"]; ok {
		t.Errorf("a group caller is listed gog.email (sensitive, private only): %+v", got["gog.email"])
	}
	all := list(group, "--include-unavailable")
	if e, ok := all["gog.email"]; !ok || e.Available || !strings.Contains(e.UnavailableReason, "capability_access_denied") ||
		!strings.Contains(e.UnavailableReason, "private") {
		t.Errorf("gog.email with --include-unavailable for a group caller = %+v, want unavailable with the chat reason", e)
	}
	if e := all["gog.calendar"]; !e.Available || e.UnavailableReason != "" {
		t.Errorf("gog.calendar (group allowed) = %+v, want available", e)
	}
	if e, ok := list(s.mint(t, "alice", "private"))["gog.email"]; !ok || !e.Available {
		t.Errorf("gog.email for a private caller = %+v, want available", e)
	}
}
