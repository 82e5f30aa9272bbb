package tool

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/capgate/capgate/risk"
)

func TestParseID(t *testing.T) {
	tests := []struct {
		id                 string
		kind               Kind
		source, name, fail string
	}{
		{id: "mcp:filesystem:read_file", kind: KindMCP, source: "filesystem", name: "read_file"},
		{id: "ext:tools.postman:get", kind: KindExt, source: "tools.postman", name: "get"},
		{id: "bridge:gog:email.list_messages", kind: KindBridge, source: "gog", name: "email.list_messages"},
		{id: "mcp:a:b:c", kind: KindMCP, source: "a", name: "b:c"},
		{id: "mcp:filesystem", fail: "want <kind>:<source>:<name>"},
		{id: "ftp:a:b", fail: "unknown source kind \"ftp\""},
		{id: "mcp::b", fail: "want"},
		{id: "nothing", fail: "want"},
	}
	for _, tt := range tests {
		k, s, n, err := ParseID(tt.id)
		if tt.fail != "" {
			if err == nil || !strings.Contains(err.Error(), tt.fail) {
				t.Errorf("ParseID(%q) error %v, want %q", tt.id, err, tt.fail)
			}
			continue
		}
		if err != nil || k != tt.kind || s != tt.source || n != tt.name {
			t.Errorf("ParseID(%q) = %s %s %s %v", tt.id, k, s, n, err)
		}
		if ID(k, s, n) != tt.id {
			t.Errorf("ID does not round-trip %q", tt.id)
		}
	}
}

func TestErrorCodes(t *testing.T) {
	cause := errors.New("dial tcp 127.0.0.1:9: connection refused")
	err := fmt.Errorf("calling mcp:x:y: %w", Wrap(cause, CodeBackendUnavailable, "upstream %s is down", "x"))
	if ErrorCode(err) != CodeBackendUnavailable {
		t.Errorf("code %s", ErrorCode(err))
	}
	if ErrorMessage(err) != "upstream x is down" {
		t.Errorf("message %q", ErrorMessage(err))
	}
	if !errors.Is(err, cause) {
		t.Error("the cause is not reachable with errors.Is")
	}
	// Anything else reads as internal, with a message that reveals nothing.
	secret := errors.New("password=hunter2")
	if ErrorCode(secret) != CodeInternal || strings.Contains(ErrorMessage(secret), "hunter2") {
		t.Errorf("unknown error: %s %q", ErrorCode(secret), ErrorMessage(secret))
	}
	if ErrorCode(nil) != "" || ErrorMessage(nil) != "" {
		t.Error("nil error has a code")
	}
}

func TestValidExposedName(t *testing.T) {
	for name, want := range map[string]bool{
		"filesystem__read_file": true, "a": true, "A-b_9": true,
		"": false, "a.b": false, "a b": false, "a:b": false, strings.Repeat("x", 65): false, strings.Repeat("x", 64): true,
	} {
		if ValidExposedName(name) != want {
			t.Errorf("ValidExposedName(%q) != %v", name, want)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	yes := true
	d := &Descriptor{
		ID: "mcp:a:b", InputSchema: []byte(`{"type":"object"}`),
		Annotations:      Annotations{ReadOnlyHint: &yes},
		Risk:             risk.Assessment{Level: risk.Low, Effects: []risk.SideEffect{risk.FSRead}},
		AllowedChatTypes: []string{"private"},
	}
	c := d.Clone()
	c.InputSchema[0] = 'X'
	*c.Annotations.ReadOnlyHint = false
	c.Risk.Effects[0] = risk.FSWrite
	c.AllowedChatTypes[0] = "group"
	if d.InputSchema[0] != '{' || !*d.Annotations.ReadOnlyHint || d.Risk.Effects[0] != risk.FSRead || d.AllowedChatTypes[0] != "private" {
		t.Errorf("changing the clone changed the original: %+v", d)
	}
}

func TestTextResult(t *testing.T) {
	r := TextResult(`say "hi"`)
	if len(r.Content) != 1 || string(r.Content[0]) != `{"text":"say \"hi\"","type":"text"}` {
		t.Errorf("content %s", r.Content)
	}
}
