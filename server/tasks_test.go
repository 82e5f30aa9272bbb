package server

import (
	"encoding/json"
	"testing"
)

// methodOf reads a plain method without json.Unmarshal; it must read
// every input as json.Unmarshal does, and refuse what it refuses.
func checkMethodOf(t *testing.T, v []byte) {
	var want string
	wantErr := json.Unmarshal(v, &want)
	got, ok := methodOf(v)
	if ok != (wantErr == nil) || (ok && got != want) {
		t.Fatalf("methodOf(%q) = %q, %v; json.Unmarshal: %q, %v", v, got, ok, want, wantErr)
	}
}

var methodSeeds = []string{
	`"tools/call"`, `"tasks/get"`, `"tasks\/get"`, `"tasks/get\u0000"`, `"tasks/get` + "\xff" + `"`,
	`"tasks/` + "\x01" + `get"`, `"a"b"`, `"`, `""`, `"tasks/get`, `tasks/get"`, `null`, `7`, `{"a":1}`,
	`"subscriptions/listen"`, `"é"`, "\"\xe2\x82\"", ` "tasks/get"`,
}

func TestMethodOfReadsAsJSONDoes(t *testing.T) {
	for _, s := range methodSeeds {
		checkMethodOf(t, []byte(s))
	}
}

func FuzzMethodOf(f *testing.F) {
	for _, s := range methodSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkMethodOf)
}

func BenchmarkMethodOf(b *testing.B) {
	v := []byte(`"tools/call"`)
	b.Run("methodOf", func(b *testing.B) {
		for b.Loop() {
			methodOf(v)
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var s string
			json.Unmarshal(v, &s)
		}
	})
}
