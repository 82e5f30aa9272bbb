package mcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/capgate/capgate/tool"
)

// DefaultMaxMessage bounds one message from an upstream unless Options
// say otherwise.
const DefaultMaxMessage = 8 << 20

// TooLargeError is a message from the upstream longer than the limit; the
// reader stops at the limit, so no more than that is ever held.
type TooLargeError struct{ Limit int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("a message from the upstream exceeds the limit of %d bytes", e.Limit)
}

// tooLarge is the caller's error for a message over the limit.
func (s *Source) tooLarge(what string, err error) *tool.Error {
	e := tool.Wrap(err, tool.CodeInvalidOutput, "mcp server %s: %s: the upstream's message exceeds the limit of %d bytes for this server",
		s.opts.Name, what, s.opts.MaxMessage)
	e.Hint = "mcp.max_result_bytes (or mcp.servers." + s.opts.Name + ".max_result_bytes) in capgate.toml sets the limit"
	return e
}

// framing says where a message ends in a stream, for limitReader.
type framing int

const (
	frameLine  framing = iota // stdio: a message is one line
	frameEvent                // SSE: an event ends at an empty line
	frameWhole                // a JSON body: the whole stream is one message
)

// limitReader fails a stream once one message in it passes max bytes. What
// came before the message that is too long is still read out first.
type limitReader struct {
	r     io.Reader
	max   int64
	frame framing
	cur   int64 // bytes of the current message so far
	line  int64 // bytes of the current line (frameEvent)
	cr    bool  // the last byte read was '\r'
	err   error // set once over the limit; every later Read returns it
	over  func()
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.r.Read(p)
	ok := l.scan(p[:n])
	if ok < n {
		l.err = &TooLargeError{Limit: l.max}
		if l.over != nil {
			l.over()
		}
		if ok > 0 {
			return ok, nil
		}
		return 0, l.err
	}
	return n, err
}

// scan counts b into the current message and returns how much of b is in
// messages that ended or are still within the limit: len(b) unless one
// went over.
func (l *limitReader) scan(b []byte) int {
	done := 0 // bytes up to the end of the last message that ended in b
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			l.cur += int64(len(b) - i)
			l.line += int64(len(b) - i)
			l.cr = b[len(b)-1] == '\r'
			break
		}
		l.cur += int64(j + 1)
		l.line += int64(j + 1)
		blank := l.line == 1 || l.line == 2 && (j > 0 && b[i+j-1] == '\r' || j == 0 && l.cr)
		if l.cur > l.max+1 { // the newline that ends it is not counted
			return done
		}
		i += j + 1
		if l.frame == frameLine || l.frame == frameEvent && blank {
			l.cur, done = 0, i
		}
		l.line, l.cr = 0, false
	}
	if l.cur > l.max {
		return done
	}
	return len(b)
}

// limitedTransport bounds every response body mcp-go's HTTP and SSE
// transports read: a JSON answer whole, an event stream event by event.
type limitedTransport struct {
	next http.RoundTripper
	max  int64
}

func (t *limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(traced(req))
	if err != nil || resp.Body == nil {
		return resp, err
	}
	frame := frameWhole
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		frame = frameEvent
	} else if resp.ContentLength > t.max {
		resp.Body.Close()
		return nil, &TooLargeError{Limit: t.max}
	}
	resp.Body = &limitBody{limitReader{r: resp.Body, max: t.max, frame: frame}, resp.Body}
	return resp, nil
}

type limitBody struct {
	limitReader
	c io.Closer
}

func (b *limitBody) Close() error { return b.c.Close() }

// guard is the state of one stdio connection's limit: whether a message
// went over it, and what to do then (end the connection and start anew).
type guard struct {
	mu      sync.Mutex
	over    bool
	onOver  func()
	started chan struct{} // closed when the connection after this one is up (or given up on)
}

func newGuard() *guard { return &guard{started: make(chan struct{})} }

// trip records that a message went over the limit and runs onOver once.
func (g *guard) trip() {
	g.mu.Lock()
	if g.over {
		g.mu.Unlock()
		return
	}
	g.over = true
	f := g.onOver
	g.mu.Unlock()
	if f != nil {
		f()
	}
}

// tripped reports whether a message went over the limit.
func (g *guard) tripped() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.over
}

// whenTripped sets what trip does; if it already tripped, f runs now.
func (g *guard) whenTripped(f func()) {
	g.mu.Lock()
	g.onOver = f
	over := g.over
	g.mu.Unlock()
	if over {
		f()
	}
}

// asTooLarge finds a TooLargeError in err.
func asTooLarge(err error) bool {
	_, ok := errors.AsType[*TooLargeError](err)
	return ok
}
