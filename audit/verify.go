package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Report is what a verification found.
type Report struct {
	Lines int    // lines in the log
	Head  string // hex SHA-256 of the last line; 64 zeros for an empty log
	// Sidecar is set by VerifyFile when a .head sidecar existed and the
	// file agreed with it. Without one, lines cut off the end go unseen.
	Sidecar bool
}

// VerifyError is a failed check: the log is not as it was written.
type VerifyError struct {
	Path   string // the file, from VerifyFile; empty from Verify
	Line   int    // 1-based line where the problem shows; 0 for the file as a whole
	Reason string
}

func (e *VerifyError) Error() string {
	s := e.Reason
	if e.Line > 0 {
		s = fmt.Sprintf("line %d: %s", e.Line, s)
	}
	if e.Path != "" {
		s = e.Path + ": " + s
	}
	return s
}

// Verify reads a log and checks its chain: every line is a JSON record
// whose seq is its line number and whose prev is the hash of the line
// before it. It cannot see lines cut off the end; VerifyFile can. A chain
// problem is a *VerifyError; a read error is returned as is.
func Verify(r io.Reader) (Report, error) {
	rep, _, err := verify(r, 0)
	return rep, err
}

// verify checks the chain and also returns the hash of line at, if the
// log has it.
func verify(r io.Reader, at int) (rep Report, hashAt string, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		prev    [sha256.Size]byte
		prevHex [2 * sha256.Size]byte
		long    []byte
		n       int
	)
	hex.Encode(prevHex[:], prev[:])
	fail := func(format string, args ...any) error {
		return &VerifyError{Line: n, Reason: fmt.Sprintf(format, args...)}
	}
	for {
		chunk, rerr := br.ReadSlice('\n')
		if rerr == bufio.ErrBufferFull {
			long = append(long, chunk...)
			continue
		}
		if rerr != nil && rerr != io.EOF {
			return rep, "", rerr
		}
		line := chunk
		if len(long) > 0 {
			long = append(long, chunk...)
			line = long
			long = long[:0]
		}
		if len(line) == 0 {
			break // io.EOF
		}
		n++
		if line[len(line)-1] != '\n' {
			return rep, "", fail("incomplete: the file ends without a newline (a write was cut short)")
		}
		line = line[:len(line)-1]
		seq, p, reason := parseLine(line)
		switch {
		case reason != "":
			return rep, "", fail("%s", reason)
		case seq > uint64(n):
			return rep, "", fail("seq is %d, want %d: %d line(s) before it were removed, or lines were reordered", seq, n, seq-uint64(n))
		case seq < uint64(n):
			return rep, "", fail("seq is %d, want %d: a line was inserted or duplicated before it, or lines were reordered", seq, n)
		case p != string(prevHex[:]) && n == 1:
			return rep, "", fail("prev is not 64 zeros, as the first line's must be: the line was edited, or lines were removed from the start")
		case p != string(prevHex[:]):
			return rep, "", fail("prev does not match line %d's hash: line %d was edited, or a line was removed, inserted or reordered", n-1, n-1)
		}
		prev = sha256.Sum256(line)
		hex.Encode(prevHex[:], prev[:])
		if n == at {
			hashAt = string(prevHex[:])
		}
		if rerr == io.EOF {
			break
		}
	}
	return Report{Lines: n, Head: string(prevHex[:])}, hashAt, nil
}

// snapshot opens the log at path and, while no Log is writing to it,
// takes its size and reads its sidecar, so that a log in use is read as of
// a moment between two group commits.
func snapshot(path string) (f *os.File, size int64, h head, haveHead bool, err error) {
	f, err = os.Open(path)
	if err != nil {
		return nil, 0, head{}, false, err
	}
	unlock, err := lockFile(f, syscall.LOCK_SH)
	if err != nil {
		f.Close()
		return nil, 0, head{}, false, fmt.Errorf("%s: %w", path, err)
	}
	defer unlock()
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, head{}, false, err
	}
	h, haveHead, err = readHead(path + ".head")
	if err != nil {
		f.Close()
		return nil, 0, head{}, false, &VerifyError{Path: path, Reason: err.Error()}
	}
	return f, st.Size(), h, haveHead, nil
}

// VerifyFile verifies the log at path like Verify, then checks it against
// its .head sidecar, if there is one: a file with fewer lines than the
// sidecar records was cut back, and a line whose hash differs from the
// sidecar's was edited. A file with more lines than the sidecar is fine:
// the writer stopped before updating it.
func VerifyFile(path string) (Report, error) {
	f, size, h, haveHead, err := snapshot(path)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	at := 0
	if haveHead {
		at = int(min(h.seq, uint64(^uint(0)>>1)))
	}
	rep, hashAt, err := verify(io.NewSectionReader(f, 0, size), at)
	if err != nil {
		if ve, ok := err.(*VerifyError); ok {
			ve.Path = path
			return rep, ve
		}
		return rep, fmt.Errorf("%s: %w", path, err)
	}
	if !haveHead {
		return rep, nil
	}
	headName := filepath.Base(path) + ".head"
	if h.seq > uint64(rep.Lines) {
		return rep, &VerifyError{Path: path, Reason: fmt.Sprintf(
			"truncated: %s records %d lines but the file has %d: line %d and after were removed", headName, h.seq, rep.Lines, rep.Lines+1)}
	}
	if h.seq > 0 && hashAt != h.hash {
		return rep, &VerifyError{Path: path, Line: at, Reason: fmt.Sprintf(
			"hash does not match %s: line %d was edited (it was the last line when the sidecar was written)", headName, at)}
	}
	rep.Sidecar = true
	return rep, nil
}
