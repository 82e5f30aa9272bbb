package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// head is a .head sidecar.
type head struct {
	seq  uint64
	hash string
	mac  string // hex HMAC-SHA256 of seq and hash under the head key; "" unkeyed
}

// readHead reads a .head sidecar; ok is false when there is none.
func readHead(path string) (h head, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return head{}, false, nil
	}
	if err != nil {
		return head{}, false, err
	}
	var v struct {
		Seq  *uint64 `json:"seq"`
		Hash string  `json:"hash"`
		MAC  string  `json:"mac"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return head{}, false, fmt.Errorf("%s: not a head sidecar: %v", path, err)
	}
	if v.Seq == nil || !isHash(v.Hash) || v.MAC != "" && !isHash(v.MAC) {
		return head{}, false, fmt.Errorf(`%s: not a head sidecar: want {"seq":N,"hash":"<64 hex digits>","mac":"<64 hex digits>"}`, path)
	}
	return head{*v.Seq, v.Hash, v.MAC}, true, nil
}

// parseLine reads seq and prev from a line, or says what is wrong with it.
func parseLine(line []byte) (seq uint64, prev string, reason string) {
	if len(bytes.TrimSpace(line)) == 0 {
		return 0, "", "empty line"
	}
	var v struct {
		Seq  *uint64 `json:"seq"`
		Prev *string `json:"prev"`
	}
	if err := json.Unmarshal(line, &v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return 0, "", fmt.Sprintf("not an audit record: %v", err)
		}
		return 0, "", fmt.Sprintf("not valid JSON: %v", err)
	}
	switch {
	case v.Seq == nil:
		return 0, "", "no seq"
	case *v.Seq == 0:
		return 0, "", "seq is 0; seq starts at 1"
	case v.Prev == nil:
		return 0, "", "no prev"
	case !isHash(*v.Prev):
		return 0, "", fmt.Sprintf("prev %q is not 64 lowercase hex digits", *v.Prev)
	}
	return *v.Seq, *v.Prev, ""
}

func isHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// tailStart returns the offset at which the last n lines of a file of size
// bytes begin. The file's final newline ends its last line; a last line
// without one still counts.
func tailStart(r io.ReaderAt, size int64, n int) (int64, error) {
	if n <= 0 {
		return size, nil
	}
	var buf [32 << 10]byte
	found := 0
	for end := size; end > 0; {
		start := max(end-int64(len(buf)), 0)
		chunk := buf[:end-start]
		if _, err := r.ReadAt(chunk, start); err != nil && err != io.EOF {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' || start+int64(i) == size-1 {
				continue
			}
			if found++; found == n {
				return start + int64(i) + 1, nil
			}
		}
		end = start
	}
	return 0, nil
}

// countLines counts the newlines in the first size bytes.
func countLines(r io.ReaderAt, size int64) (int, error) {
	sr := io.NewSectionReader(r, 0, size)
	var buf [64 << 10]byte
	n := 0
	for {
		m, err := sr.Read(buf[:])
		n += bytes.Count(buf[:m], []byte{'\n'})
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// TailFile returns the last n lines of the file at path, as they are, as
// of a moment between two group commits.
func TailFile(path string, n int) ([]byte, error) {
	f, size, _, _, err := snapshot(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	start, err := tailStart(f, size, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make([]byte, size-start)
	if _, err := f.ReadAt(out, start); err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
