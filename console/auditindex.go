package console

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// auditIndex is an index of the audit log for the audit page: a few fields
// of each record and where its line is. The log stays the source of truth:
// a record's detail is read from the file, and the index only follows the
// file (what was appended since, or all of it again when the file was
// rotated or cut).
type auditIndex struct {
	path string

	mu     sync.Mutex
	file   os.FileInfo // the file indexed, to notice a rotation
	offset int64       // the file's bytes indexed so far (whole lines)
	recs   []auditRec
}

// auditRec is one record's fields the filters use.
type auditRec struct {
	Seq                       uint64
	Time                      time.Time
	Type, Sub, Tool, Decision string
	Gate, Code                string
	DurationMS                float64
	off                       int64
	n                         int
}

func newAuditIndex(path string) *auditIndex { return &auditIndex{path: path} }

// refresh brings the index up to the file's end.
func (x *auditIndex) refresh() error {
	if x.path == "" {
		return errors.New("no audit log")
	}
	f, err := os.Open(x.path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if x.file == nil || !os.SameFile(x.file, fi) || fi.Size() < x.offset {
		x.offset, x.recs = 0, x.recs[:0]
	}
	x.file = fi
	if fi.Size() == x.offset {
		return nil
	}
	if _, err := f.Seek(x.offset, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<20)
	off := x.offset
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: read the rest of it.
			rest, err2 := r.ReadBytes('\n')
			line, err = append(bytes.Clone(line), rest...), err2
		}
		if err != nil {
			break // a partial last line waits for its newline
		}
		x.recs = append(x.recs, parseRec(line, off))
		off += int64(len(line))
	}
	x.offset = off
	return nil
}

func parseRec(line []byte, off int64) auditRec {
	var raw struct {
		Type       string  `json:"type"`
		Time       string  `json:"time"`
		Seq        uint64  `json:"seq"`
		Sub        string  `json:"sub"`
		Tool       string  `json:"tool"`
		ToolName   string  `json:"tool_name"`
		Decision   string  `json:"decision"`
		Gate       string  `json:"gate"`
		Code       string  `json:"code"`
		DurationMS float64 `json:"duration_ms"`
	}
	_ = json.Unmarshal(line, &raw) // a damaged line is still listed, by its place
	t, _ := time.Parse(time.RFC3339Nano, raw.Time)
	tl := raw.Tool
	if tl == "" {
		tl = raw.ToolName
	}
	return auditRec{Seq: raw.Seq, Time: t, Type: raw.Type, Sub: raw.Sub, Tool: tl, Decision: raw.Decision,
		Gate: raw.Gate, Code: raw.Code, DurationMS: raw.DurationMS, off: off, n: len(line)}
}

// auditFilter selects records; empty fields match all.
type auditFilter struct {
	Sub, Tool, Decision, Code, Gate, Type string
	From, To                              time.Time
	Before                                uint64 // only records with a smaller seq (paging)
}

func filterFrom(r *http.Request) auditFilter {
	q := r.URL.Query()
	f := auditFilter{Sub: q.Get("sub"), Tool: q.Get("tool"), Decision: q.Get("decision"), Code: q.Get("code"),
		Gate: q.Get("gate"), Type: q.Get("type")}
	f.From = parseWhen(q.Get("from"))
	f.To = parseWhen(q.Get("to"))
	f.Before, _ = strconv.ParseUint(q.Get("before"), 10, 64)
	return f
}

// parseWhen reads a form's datetime-local (UTC) or RFC 3339 time.
func parseWhen(s string) time.Time {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	return time.Time{}
}

func (f auditFilter) match(r *auditRec) bool {
	switch {
	case f.Sub != "" && r.Sub != f.Sub,
		f.Tool != "" && r.Tool != f.Tool,
		f.Decision != "" && r.Decision != f.Decision,
		f.Code != "" && r.Code != f.Code,
		f.Gate != "" && r.Gate != f.Gate,
		f.Type != "" && r.Type != f.Type,
		!f.From.IsZero() && r.Time.Before(f.From),
		!f.To.IsZero() && r.Time.After(f.To),
		f.Before != 0 && r.Seq >= f.Before:
		return false
	}
	return true
}

// query returns up to limit records matching f, newest first, and the total
// number of records indexed.
func (x *auditIndex) query(f auditFilter, limit int) ([]auditRec, int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.refresh(); err != nil {
		return nil, 0, err
	}
	var out []auditRec
	for i := len(x.recs) - 1; i >= 0 && len(out) < limit; i-- {
		if f.match(&x.recs[i]) {
			out = append(out, x.recs[i])
		}
	}
	return out, len(x.recs), nil
}

// line reads record seq's line from the log.
func (x *auditIndex) line(seq uint64) ([]byte, error) {
	x.mu.Lock()
	if err := x.refresh(); err != nil {
		x.mu.Unlock()
		return nil, err
	}
	i, ok := slices.BinarySearchFunc(x.recs, seq, func(r auditRec, s uint64) int {
		switch {
		case r.Seq < s:
			return -1
		case r.Seq > s:
			return 1
		}
		return 0
	})
	var rec auditRec
	if ok {
		rec = x.recs[i]
	}
	x.mu.Unlock()
	if !ok {
		return nil, os.ErrNotExist
	}
	f, err := os.Open(x.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, rec.n)
	if _, err := f.ReadAt(b, rec.off); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b, "\n"), nil
}

// bar is one minute of the live page's chart.
type bar struct {
	Minute           string
	Allow, Deny      int
	X, HA, HD, Y, YA int // drawing: x, the heights, the deny bar's top and the allow bar's
}

// chart is calls and denials per minute, with the denials' codes.
type chart struct {
	Bars  []bar
	Codes map[string]int
	Max   int
}

// perMinute counts tool calls allowed and denied in each of the last n
// minutes before now, from the audit records.
func (x *auditIndex) perMinute(now time.Time, n int) chart {
	x.mu.Lock()
	defer x.mu.Unlock()
	ch := chart{Codes: map[string]int{}}
	_ = x.refresh()
	start := now.Truncate(time.Minute).Add(-time.Duration(n-1) * time.Minute)
	ch.Bars = make([]bar, n)
	for i := range ch.Bars {
		ch.Bars[i].Minute = start.Add(time.Duration(i) * time.Minute).UTC().Format("15:04")
	}
	for i := len(x.recs) - 1; i >= 0; i-- {
		r := &x.recs[i]
		if r.Time.Before(start) {
			break
		}
		if r.Type != "tool_call" {
			continue
		}
		k := int(r.Time.Sub(start) / time.Minute)
		if k < 0 || k >= n {
			continue
		}
		if r.Decision == "allow" {
			ch.Bars[k].Allow++
		} else {
			ch.Bars[k].Deny++
			ch.Codes[r.Code]++
		}
	}
	for _, b := range ch.Bars {
		ch.Max = max(ch.Max, b.Allow+b.Deny)
	}
	const height = 80
	for i := range ch.Bars {
		b := &ch.Bars[i]
		b.X = i * 12
		if ch.Max > 0 {
			b.HA = b.Allow * height / ch.Max
			b.HD = b.Deny * height / ch.Max
		}
		b.Y = height - b.HA - b.HD
		b.YA = b.Y + b.HD
	}
	return ch
}
