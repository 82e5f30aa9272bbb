package audit

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// The .head sidecar is replaced at most every headEvery: the groups in
// between are fsynced without it. Flush brings it up to date at once, and
// a head held back is written when it falls due even if no event follows.
func TestHeadReplacedAtMostEveryHeadEvery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{FlushInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.iomu.Lock()
	l.headEvery = time.Hour
	l.iomu.Unlock()
	// What .head names once the I/O under way (which holds iomu) is done.
	headSeq := func() uint64 {
		l.iomu.Lock()
		l.iomu.Unlock()
		h, ok, err := readHead(path + ".head")
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return 0
		}
		return h.seq
	}
	// The first group writes the head: none was written before.
	l.Log(fullEvent(TypeToolCall, 1))
	testkit.WaitFor(t, 10*time.Second, "the first group's fsync", func() bool { return l.syncs.Load() >= 1 })
	if got := headSeq(); got != 1 {
		t.Fatalf("head after the first group: seq %d, want 1", got)
	}
	// The next groups are fsynced; the head stays as it was.
	for i := 2; i <= 3; i++ {
		l.Log(fullEvent(TypeToolCall, 1))
		testkit.WaitFor(t, 10*time.Second, "a later group's fsync", func() bool { return l.syncs.Load() >= uint64(i) })
	}
	if got := headSeq(); got != 1 {
		t.Fatalf("head within headEvery of the last: seq %d, want 1 (replaced too often)", got)
	}
	// Flush writes it whatever the time.
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := headSeq(); got != 3 {
		t.Fatalf("head after Flush: seq %d, want 3", got)
	}
	// A head held back is written once due, with no event after it.
	l.iomu.Lock()
	l.headEvery = 50 * time.Millisecond
	l.iomu.Unlock()
	l.Log(fullEvent(TypeToolCall, 1))
	testkit.WaitFor(t, 10*time.Second, "the held-back head", func() bool { return headSeq() == 4 })
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 4 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}
