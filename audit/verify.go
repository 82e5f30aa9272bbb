package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Report is what a verification found.
type Report struct {
	Lines int    // lines in the log
	Head  string // hex SHA-256 of the last line; 64 zeros for an empty log
	// Sidecar is set by VerifyFile when a .head sidecar existed and the
	// file agreed with it. Without one, lines cut off the end go unseen.
	Sidecar bool
	// Keyed is set by VerifyFileKeyed when the sidecar's MAC verified
	// under the key: then a head rewritten to hide lines cut off the end
	// would have been found.
	Keyed bool
	// Files are the files VerifyFile checked, in chain order: the log's
	// moved-aside files (see Options.MaxSize), then the log itself.
	Files []string
	// FirstSeq is the seq of the first line checked. Above 1, the files
	// holding the lines before it were pruned (Options.MaxFiles) or
	// removed: the chain is checked from there on.
	FirstSeq uint64
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
	var c chain
	err := c.verify(r, 0)
	return Report{Lines: int(c.seq), Head: hex.EncodeToString(c.prev[:]), FirstSeq: 1}, err
}

// chain is where a verification stands: the seq and hash of the last line
// checked, and the hash of the line at seq at, once seen.
type chain struct {
	seq  uint64
	prev [sha256.Size]byte
	// open: the first line checked may continue a chain whose start is
	// gone; its seq and prev are taken as they are.
	open     bool
	first    uint64
	hashAt   string
	previous string // the file before this one, for messages
}

// verify checks one file's lines, continuing c.
func (c *chain) verify(r io.Reader, at uint64) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		prevHex [2 * sha256.Size]byte
		long    []byte
		n       int
	)
	prev := c.prev
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
			return rerr
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
			return fail("incomplete: the file ends without a newline (a write was cut short)")
		}
		line = line[:len(line)-1]
		seq, p, reason := parseLine(line)
		if reason != "" {
			return fail("%s", reason)
		}
		if c.open {
			// The lines before this one are in files no longer kept.
			c.open, c.first, c.seq = false, seq, seq-1
			if seq != 1 {
				copy(prevHex[:], p)
			}
		}
		want := c.seq + 1
		switch {
		case seq > want:
			return fail("seq is %d, want %d: %d line(s) before it were removed, or lines were reordered", seq, want, seq-want)
		case seq < want:
			return fail("seq is %d, want %d: a line was inserted or duplicated before it, or lines were reordered", seq, want)
		case p != string(prevHex[:]) && seq == 1:
			return fail("prev is not 64 zeros, as the first line's must be: the line was edited, or lines were removed from the start")
		case p != string(prevHex[:]) && n == 1:
			return fail("prev does not match the hash of the last line of %s: this line was edited, or lines or a whole file were removed or replaced before it", c.previous)
		case p != string(prevHex[:]):
			return fail("prev does not match line %d's hash: line %d was edited, or a line was removed, inserted or reordered", n-1, n-1)
		}
		prev = sha256.Sum256(line)
		hex.Encode(prevHex[:], prev[:])
		c.seq, c.prev = seq, prev
		if seq == at {
			c.hashAt = string(prevHex[:])
		}
		if rerr == io.EOF {
			break
		}
	}
	return nil
}

// snapshot opens the log at path and, while no Log is writing to it,
// takes its size and reads its sidecar, so that a log in use is read as of
// a moment between two group commits.
func snapshot(path string) (f *os.File, size int64, h head, haveHead bool, err error) {
	f, err = os.Open(path)
	if err != nil {
		return nil, 0, head{}, false, err
	}
	unlock, err := lockFile(f, lockSh)
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

// VerifyFile verifies the log at path like Verify, following the chain
// through its moved-aside files first (<path>.<seq>, oldest first; see
// Options.MaxSize), then checks it against its .head sidecar, if there is
// one: a log with fewer lines than the sidecar records was cut back, and
// a line whose hash differs from the sidecar's was edited. A log with more
// lines than the sidecar is fine: the writer stopped before updating it.
// When the oldest file kept does not start the chain, the files before it
// were pruned: Report.FirstSeq says where checking began.
func VerifyFile(path string) (Report, error) { return VerifyFileKeyed(path, nil) }

// VerifyFileKeyed is VerifyFile, and with key (HeadKey of capgate's
// secret) the log must have a .head sidecar whose MAC verifies: a head
// rewritten, stripped of its MAC or removed, as truncating the log
// without the key needs, is a *VerifyError.
func VerifyFileKeyed(path string, key []byte) (Report, error) {
	f, size, h, haveHead, err := snapshot(path)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	// Listed after the snapshot, so that every file before f is listed;
	// f itself, if it was moved aside since, and any file after it are
	// left out: the log is read as of the snapshot.
	all, err := rotatedFiles(path)
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", path, err)
	}
	fst, err := f.Stat()
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", path, err)
	}
	var files []rotatedFile
	for _, rf := range all {
		if st, err := os.Stat(rf.path); err == nil && os.SameFile(st, fst) {
			break
		}
		files = append(files, rf)
	}
	at := uint64(0)
	if haveHead {
		at = h.seq
	}
	c := chain{open: len(files) > 0, first: 1}
	rep := Report{}
	check := func(name string, r io.Reader, last uint64) error {
		rep.Files = append(rep.Files, name)
		err := c.verify(r, at)
		if ve, ok := err.(*VerifyError); ok {
			ve.Path = name
			return ve
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if last != 0 && c.seq != last {
			return &VerifyError{Path: name, Reason: fmt.Sprintf("the name says its last line has seq %d, but it has %d: the file was renamed, or lines were added or removed at its end", last, c.seq)}
		}
		c.previous = name
		return nil
	}
	for _, rf := range files {
		rfd, err := os.Open(rf.path)
		if errors.Is(err, os.ErrNotExist) && len(rep.Files) == 0 {
			continue // pruned meanwhile
		}
		if err != nil {
			return rep, err
		}
		err = check(rf.path, rfd, rf.last)
		rfd.Close()
		if err != nil {
			return rep, err
		}
	}
	if err := check(path, io.NewSectionReader(f, 0, size), 0); err != nil {
		return rep, err
	}
	rep.Lines = int(c.seq - c.first + 1)
	if c.open { // no line at all
		rep.Lines = 0
	}
	rep.FirstSeq = c.first
	rep.Head = hex.EncodeToString(c.prev[:])
	headName := filepath.Base(path) + ".head"
	if key != nil {
		if !haveHead {
			return rep, &VerifyError{Path: path, Reason: fmt.Sprintf(
				"no %s: a log written with capgate's key always has one, so it was removed (and lines may have been cut off the end)", headName)}
		}
		if err := h.checkMAC(key, headName); err != nil {
			return rep, &VerifyError{Path: path, Reason: err.Error() + "; lines may have been cut off the end"}
		}
	}
	if !haveHead {
		return rep, nil
	}
	if h.seq > c.seq {
		return rep, &VerifyError{Path: path, Reason: fmt.Sprintf(
			"truncated: %s records %d lines but the file has %d: line %d and after were removed", headName, h.seq, c.seq, c.seq+1)}
	}
	if h.seq > 0 && h.seq >= c.first && c.hashAt != h.hash {
		ve := &VerifyError{Path: path, Reason: fmt.Sprintf(
			"hash does not match %s: the line with seq %d was edited (it was the last line when the sidecar was written)", headName, h.seq)}
		if len(rep.Files) == 1 { // seq is the line number
			ve.Line = int(min(h.seq, uint64(^uint(0)>>1)))
			ve.Reason = fmt.Sprintf("hash does not match %s: line %d was edited (it was the last line when the sidecar was written)", headName, h.seq)
		}
		return rep, ve
	}
	rep.Sidecar, rep.Keyed = true, key != nil
	return rep, nil
}
