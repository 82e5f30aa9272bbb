package audit

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// A Log opened with a replica id writes it in every record that names no
// other; the chain holds as before.
func TestLogStampsReplica(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := openT(t, path, Options{Replica: "replica-a"})
	l.Log(Event{Type: TypeToolCall, Sub: "alice"})
	l.Log(Event{Type: TypeToolCall, Sub: "bob", Replica: "given"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range readLines(t, path) {
		var rec struct{ Replica string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		got = append(got, rec.Replica)
	}
	if len(got) != 2 || got[0] != "replica-a" || got[1] != "given" {
		t.Errorf("replicas = %q, want [replica-a given]", got)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 2 {
		t.Errorf("VerifyFile = %+v, %v", rep, err)
	}
}
