package audit

import (
	"crypto/sha256"
	"path/filepath"
	"testing"
)

// BenchmarkLog measures Log from parallel callers with every field set,
// through to the file: the writer's group commits run alongside.
func BenchmarkLog(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	e := fullEvent(TypeCapabilityCheck, 1)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Log(e)
		}
	})
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(l.syncs.Load()), "fsyncs")
}

// BenchmarkEncode measures the writer's per-event work: encoding and
// hashing one line.
func BenchmarkEncode(b *testing.B) {
	e := fullEvent(TypeCapabilityCheck, 1)
	var prev [sha256.Size]byte
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendEvent(buf[:0], &e, 42, &prev)
		prev = sha256.Sum256(buf)
	}
	b.SetBytes(int64(len(buf)))
}
