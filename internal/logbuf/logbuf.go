// Package logbuf coalesces the log's writes under load: serve logs one
// line per call, and a write(2) per line was a measurable part of a
// call's CPU at concurrency 1. A line that comes after a quiet spell is
// written at once; lines that follow it within the window are gathered
// and written together when it ends. So a lone line is never delayed, and
// a busy log costs about one write per window.
package logbuf

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// maxBuffered: at this many bytes gathered they are written at once.
const maxBuffered = 64 << 10

// Writer is an io.Writer over w that coalesces writes as the package
// says. Each Write should be whole lines (slog's handlers write one
// record per call). It is safe for concurrent use.
type Writer struct {
	w      io.Writer
	window time.Duration

	mu    sync.Mutex
	buf   []byte
	last  time.Time // when w was last written
	timer *time.Timer
	armed bool
	err   error // the first error writing what was gathered
}

// New returns a Writer over w that gathers lines for window after a
// write.
func New(w io.Writer, window time.Duration) *Writer {
	b := &Writer{w: w, window: window}
	b.timer = time.AfterFunc(time.Hour, func() { _ = b.Flush() })
	b.timer.Stop()
	return b
}

// Write writes p at once after a quiet spell, else gathers it.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.armed { // a flush is due already: gather, without reading the clock
		b.buf = append(b.buf, p...)
		if len(b.buf) >= maxBuffered {
			b.flushLocked()
		}
		return len(p), nil
	}
	now := time.Now()
	if len(b.buf) == 0 && now.Sub(b.last) >= b.window {
		b.last = now
		return b.w.Write(p)
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= maxBuffered {
		b.flushLocked()
	} else if !b.armed {
		b.armed = true
		b.timer.Reset(b.window - now.Sub(b.last))
	}
	return len(p), nil
}

// Flush writes what is gathered, and returns the first error met writing
// gathered lines since the last Flush.
func (b *Writer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	err := b.err
	b.err = nil
	return err
}

func (b *Writer) flushLocked() {
	b.armed = false
	b.timer.Stop()
	if len(b.buf) == 0 {
		return
	}
	if _, err := b.w.Write(b.buf); err != nil && b.err == nil {
		b.err = err
	}
	b.last = time.Now()
	if cap(b.buf) > maxBuffered {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
}

// Urgent wraps h, which writes to w, so that a record at level or above
// is written at once, with whatever was gathered before it: warnings are
// rare, and an operator watching the log (or a test reading it) should not
// wait a window for one. Records below level cost one comparison more.
func Urgent(h slog.Handler, w *Writer, level slog.Level) slog.Handler {
	return urgent{Handler: h, w: w, level: level}
}

type urgent struct {
	slog.Handler
	w     *Writer
	level slog.Level
}

func (u urgent) Handle(ctx context.Context, r slog.Record) error {
	err := u.Handler.Handle(ctx, r)
	if r.Level >= u.level {
		if ferr := u.w.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (u urgent) WithAttrs(attrs []slog.Attr) slog.Handler {
	return urgent{Handler: u.Handler.WithAttrs(attrs), w: u.w, level: u.level}
}

func (u urgent) WithGroup(name string) slog.Handler {
	return urgent{Handler: u.Handler.WithGroup(name), w: u.w, level: u.level}
}
