package audit

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two replicas' logs merge in time order, the last n lines of both.
func TestMergeTail(t *testing.T) {
	dir := t.TempDir()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	write := func(name string, replica string, minutes ...int) string {
		path := filepath.Join(dir, name)
		l := openT(t, path, Options{Replica: replica})
		for _, m := range minutes {
			l.Log(Event{Type: TypeToolCall, Time: base.Add(time.Duration(m) * time.Minute), Detail: replica + string(rune('0'+m))})
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a := write("a.jsonl", "a", 1, 3, 5, 6)
	b := write("b.jsonl", "b", 2, 4, 5, 7)
	out, err := MergeTail([]string{a, b}, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
		_, rest, _ := strings.Cut(line, `"detail":"`)
		d, _, _ := strings.Cut(rest, `"`)
		got = append(got, d)
	}
	if want := "b4 a5 b5 a6 b7"; strings.Join(got, " ") != want {
		t.Errorf("merged = %v, want %s", got, want)
	}
	if _, err := MergeTail([]string{a, filepath.Join(dir, "nope")}, 5); err == nil {
		t.Error("a missing log merged")
	}
}
