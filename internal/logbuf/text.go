package logbuf

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// TextHandler is slog.NewTextHandler(b, opts) that writes the plainest
// records itself: serve's one "call" line per call went through slog's
// general machinery (handle state, pooled buffers, a Value switch per
// attribute), a measurable part of a call's CPU at concurrency 1. A
// record whose attributes are all strings, numbers and booleans with
// non-empty keys is written here, byte for byte as slog writes it
// (FuzzTextHandler holds them together); anything else, and every
// handler made by WithAttrs or WithGroup, is slog's. Options that change
// what slog writes (AddSource, ReplaceAttr) leave slog all of it.
func (b *Writer) TextHandler(opts *slog.HandlerOptions) slog.Handler {
	h := slog.NewTextHandler(b, opts)
	if opts != nil && (opts.AddSource || opts.ReplaceAttr != nil) {
		return h
	}
	return &textHandler{TextHandler: h, w: b}
}

// textHandler is TextHandler's: b is safe for concurrent use and takes
// whole lines, so its lines and slog's interleave whole.
type textHandler struct {
	*slog.TextHandler
	w *Writer
}

var lines = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

func (h *textHandler) Handle(ctx context.Context, r slog.Record) error {
	bp := lines.Get().(*[]byte)
	b, ok := appendRecord((*bp)[:0], r)
	if !ok {
		lines.Put(bp)
		return h.TextHandler.Handle(ctx, r)
	}
	_, err := h.w.Write(b)
	if cap(b) <= 4<<10 {
		*bp = b
		lines.Put(bp)
	}
	return err
}

// appendRecord appends r as slog's text handler writes it, when r is
// plain enough; else it says no.
func appendRecord(b []byte, r slog.Record) ([]byte, bool) {
	if !r.Time.IsZero() {
		b = append(b, "time="...)
		b = appendRFC3339Millis(b, r.Time.Round(0))
		b = append(b, ' ')
	}
	b = append(b, "level="...)
	b = appendText(b, r.Level.String())
	b = append(b, " msg="...)
	b = appendText(b, r.Message)
	ok := true
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "" {
			ok = false
			return false
		}
		b = append(b, ' ')
		b = appendText(b, a.Key)
		b = append(b, '=')
		switch v := a.Value; v.Kind() {
		case slog.KindString:
			b = appendText(b, v.String())
		case slog.KindFloat64:
			b = strconv.AppendFloat(b, v.Float64(), 'g', -1, 64)
		case slog.KindInt64:
			b = strconv.AppendInt(b, v.Int64(), 10)
		case slog.KindBool:
			b = strconv.AppendBool(b, v.Bool())
		default:
			ok = false
		}
		return ok
	})
	return append(b, '\n'), ok
}

// appendText appends s as slog's text handler writes a string: as it
// is, or quoted when it has to be.
func appendText(b []byte, s string) []byte {
	if needsQuoting(s) {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

// needsQuoting is slog's rule (text_handler.go): empty, a space, '=', a
// character a JSON string escapes (but '\\'; slog's safeSet has DEL), or
// a rune that is invalid, a space or not printable.
func needsQuoting(s string) bool {
	if len(s) == 0 {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == '=' || c == '"' {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

// appendRFC3339Millis is slog's time format: RFC 3339 with milliseconds.
func appendRFC3339Millis(b []byte, t time.Time) []byte {
	const prefixLen = len("2006-01-02T15:04:05.000")
	n := len(b)
	t = t.Truncate(time.Millisecond).Add(time.Millisecond / 10)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefixLen], b[n+prefixLen+1:]...) // drop the 4th digit
}
