package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRotation writes a log past MaxSize several times over: the chain
// continues from file to file, only MaxFiles moved-aside files are kept,
// VerifyFile follows the chain across them and says where it began, a
// reopened Log continues the chain even when the current file is empty,
// and removing or tearing a file is reported.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	const maxSize, maxFiles = 4096, 3
	l := openT(t, path, Options{MaxSize: maxSize, MaxFiles: maxFiles})
	total := 0
	for range 20 { // 20 groups of 4 events of about 600 bytes
		for range 4 {
			total++
			l.Log(fullEvent(TypeToolCall, total))
		}
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := rotatedFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != maxFiles {
		t.Fatalf("%d moved-aside files, want %d (MaxFiles): %v", len(files), maxFiles, files)
	}
	// Each file continues the one before: seq and prev.
	var lastHash string
	var lastSeq uint64
	kept := 0
	for i, name := range append(names(files), path) {
		lines := readLines(t, name)
		kept += len(lines)
		st, _ := os.Stat(name)
		if name != path && st.Size() > maxSize {
			t.Errorf("%s: %d bytes, over MaxSize", name, st.Size())
		}
		var first struct {
			Seq  uint64
			Prev string
		}
		mustJSON(t, lines[0], &first)
		if i > 0 && (first.Seq != lastSeq+1 || first.Prev != lastHash) {
			t.Errorf("%s starts with seq %d prev %s, want %d %s", name, first.Seq, first.Prev, lastSeq+1, lastHash)
		}
		last := lines[len(lines)-1]
		sum := sha256.Sum256([]byte(last))
		lastHash = hex.EncodeToString(sum[:])
		var lv struct{ Seq uint64 }
		mustJSON(t, last, &lv)
		lastSeq = lv.Seq
		if name != path && !strings.HasSuffix(name, "."+strconv.FormatUint(lastSeq, 10)) {
			t.Errorf("%s: its last line has seq %d", name, lastSeq)
		}
	}
	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lines != kept || lastSeq != uint64(total) || rep.Head != lastHash || !rep.Sidecar ||
		rep.FirstSeq != uint64(total-kept+1) || rep.FirstSeq <= 1 || len(rep.Files) != maxFiles+1 || rep.Files[maxFiles] != path {
		t.Errorf("report %+v; want %d lines of %d, head %s", rep, kept, total, lastHash)
	}

	// A crash right after a rotation leaves an empty file at path: the
	// chain goes on from the newest moved-aside file.
	if err := os.Rename(path, path+"."+strconv.FormatUint(lastSeq, 10)); err != nil {
		t.Fatal(err)
	}
	l = openT(t, path, Options{MaxSize: maxSize, MaxFiles: maxFiles})
	l.Log(fullEvent(TypeToolCall, total+1))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyFile(path); err != nil || rep.Lines != kept+1 {
		t.Fatalf("after reopening on an empty file: %+v %v", rep, err)
	}

	// A moved-aside file removed from the middle of the chain.
	files, _ = rotatedFiles(path)
	mid := files[len(files)/2].path
	data, _ := os.ReadFile(mid)
	os.Remove(mid)
	var ve *VerifyError
	if _, err := VerifyFile(path); !errors.As(err, &ve) || ve.Line != 1 || !strings.Contains(ve.Reason, "removed") {
		t.Errorf("a file removed: %v", err)
	}
	// A torn last line in a moved-aside file.
	os.WriteFile(mid, data[:len(data)-40], 0o600)
	if _, err := VerifyFile(path); !errors.As(err, &ve) || ve.Path != mid || !strings.Contains(ve.Reason, "incomplete") {
		t.Errorf("a torn moved-aside file: %v", err)
	}
	os.WriteFile(mid, data, 0o600)
	if _, err := VerifyFile(path); err != nil {
		t.Fatal(err)
	}
	// A torn last line at the end of the log: reported, and not extended.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"type":"tool_call","time":"2026-03-01T11:00:00Z","seq":`)
	f.Close()
	if _, err := VerifyFile(path); !errors.As(err, &ve) || ve.Path != path || !strings.Contains(ve.Reason, "incomplete") {
		t.Errorf("a torn last line: %v", err)
	}
	if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("Open on a torn last line: %v", err)
	}
}

func names(files []rotatedFile) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.path)
	}
	return out
}

func mustJSON(t *testing.T, line string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(line), v); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
}
