package audit

import (
	"crypto/sha256"
	"path/filepath"
	"testing"

	"github.com/capgate/capgate/internal/testkit"
)

// BenchmarkLog measures Log from parallel callers with every field set,
// through to the file: ns/op is the sustained rate, with the writer, the
// write(2)s and the fsyncs running alongside until Close. cpu-ns/op is
// the CPU time the whole process spent per event, which other load on the
// machine does not inflate the way it does ns/op.
func BenchmarkLog(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	e := fullEvent(TypeCapabilityCheck, 1)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := testkit.CPUTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Log(e)
		}
	})
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(l.syncs.Load()), "fsyncs")
}

// BenchmarkEncode is Log's own work on an event, in the caller's
// goroutine: all of the line but seq and prev.
func BenchmarkEncode(b *testing.B) {
	e := fullEvent(TypeCapabilityCheck, 1)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendHead(buf[:0], &e)
		buf = appendTail(buf, &e)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkChain is the writer's work on an event, the part that cannot
// run in parallel: splice in seq and prev, hash the line.
func BenchmarkChain(b *testing.B) {
	e := fullEvent(TypeCapabilityCheck, 1)
	head := appendHead(nil, &e)
	tail := appendTail(nil, &e)
	var prev [sha256.Size]byte
	line := make([]byte, 0, 1024)
	seq := uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		line, _, _ = appendLine(line[:0], head, seq, tail, &prev)
		prev = sha256.Sum256(line)
		seq++
	}
	b.SetBytes(int64(len(line)))
}
