package audit

import (
	"bytes"
	"encoding/json"
	"slices"
	"time"
)

// MergeTail returns the last n records of the logs at paths (each
// replica writes its own) merged in time order, each line as it is. Lines
// of equal time keep their files' order, and a line whose time cannot be
// read (one being written) stays after the line before it in its file.
func MergeTail(paths []string, n int) ([]byte, error) {
	type line struct {
		t    time.Time
		file int
		b    []byte
	}
	var all []line
	for i, path := range paths {
		b, err := TailFile(path, n)
		if err != nil {
			return nil, err
		}
		var last time.Time
		for raw := range bytes.Lines(b) {
			var rec struct {
				Time time.Time `json:"time"`
			}
			if json.Unmarshal(raw, &rec) == nil && !rec.Time.IsZero() {
				last = rec.Time
			}
			if raw[len(raw)-1] != '\n' {
				raw = append(raw[:len(raw):len(raw)], '\n') // an incomplete last line
			}
			all = append(all, line{last, i, raw})
		}
	}
	slices.SortStableFunc(all, func(a, b line) int {
		if c := a.t.Compare(b.t); c != 0 {
			return c
		}
		return a.file - b.file
	})
	var out []byte
	for _, l := range all[max(0, len(all)-n):] {
		out = append(out, l.b...)
	}
	return out, nil
}
