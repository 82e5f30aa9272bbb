package h1

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// ResponseWriter writes one response. A body written and not flushed by
// the time the handler returns goes out with a Content-Length; once the
// handler flushes, or writes more than fits the buffer, the rest is sent
// chunked. It is an http.ResponseWriter and an http.Flusher, and it
// satisfies mcp-go's HTTPResponseWriter.
type ResponseWriter struct {
	bw     *bufio.Writer
	c      net.Conn
	header http.Header
	head   bool // a HEAD request: no body

	status      int
	wroteHeader bool
	committed   bool // the head is on the wire; the body is chunked
	close       bool // close the connection after this response
	buf         []byte
	written     int64 // body bytes the handler wrote
	err         error
	abort       bool // the handler panicked with http.ErrAbortHandler
}

// reset forgets what the handler set and wrote, before anything was sent.
func (w *ResponseWriter) reset() {
	w.header, w.buf, w.wroteHeader, w.status, w.written = http.Header{}, nil, false, 0, 0
}

// bufferMax is how much body is held for a Content-Length before the
// response turns chunked.
const bufferMax = 16 << 10

func (w *ResponseWriter) Header() http.Header { return w.header }

func (w *ResponseWriter) WriteHeader(status int) {
	if w.wroteHeader || status < 100 || status > 999 {
		return
	}
	if status < 200 {
		return // 1xx are not sent
	}
	w.wroteHeader, w.status = true, status
}

func (w *ResponseWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	w.written += int64(len(p))
	if !bodyAllowed(w.status) || w.head {
		return len(p), nil
	}
	if !w.committed {
		if len(w.buf)+len(p) <= bufferMax {
			w.buf = append(w.buf, p...)
			return len(p), nil
		}
		w.commit()
	}
	w.chunk(p)
	return len(p), w.err
}

// Flush sends what has been written.
func (w *ResponseWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit()
	}
	if w.err == nil {
		w.err = w.bw.Flush()
	}
}

// CanStream is true: Flush delivers at once.
func (w *ResponseWriter) CanStream() bool { return true }

// SetWriteDeadline bounds the writes of the response.
func (w *ResponseWriter) SetWriteDeadline(t time.Time) error { return w.c.SetWriteDeadline(t) }

// commit writes the head of a chunked response (or a bodiless one), with
// what was buffered as the first chunk.
func (w *ResponseWriter) commit() {
	w.committed = true
	chunked := bodyAllowed(w.status) && !w.head
	if chunked {
		w.header.Del("Content-Length")
		w.writeHead("chunked", -1)
	} else {
		w.writeHead("", -1)
	}
	if len(w.buf) > 0 {
		b := w.buf
		w.buf = nil
		w.chunk(b)
	}
}

func (w *ResponseWriter) chunk(p []byte) {
	if w.err != nil || len(p) == 0 {
		return
	}
	w.bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
	w.bw.WriteString("\r\n")
	w.bw.Write(p)
	_, w.err = w.bw.WriteString("\r\n")
}

// finish completes the response after the handler returned.
func (w *ResponseWriter) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed && w.head && bodyAllowed(w.status) {
		// A HEAD answer says what GET's would: the handler's own
		// Content-Length, else the length it wrote.
		n := w.written
		if cl, err := strconv.ParseInt(w.header.Get("Content-Length"), 10, 64); err == nil && cl >= 0 {
			n = cl
		}
		w.writeHead("", int(n))
		if w.err != nil {
			return w.err
		}
		return w.bw.Flush()
	}
	if w.committed {
		if bodyAllowed(w.status) && !w.head {
			w.bw.WriteString("0\r\n\r\n")
		}
	} else {
		n := len(w.buf)
		if !bodyAllowed(w.status) {
			n = -1
		}
		w.writeHead("", n)
		w.bw.Write(w.buf)
	}
	if w.err != nil {
		return w.err
	}
	return w.bw.Flush()
}

// writeHead writes the status line and header fields, with a
// Content-Length of n when n ≥ 0.
func (w *ResponseWriter) writeHead(te string, n int) {
	if hasToken(w.header["Connection"], "close") {
		w.close = true
	}
	bw := w.bw
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(w.status))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(w.status))
	bw.WriteString("\r\n")
	for k, vs := range w.header {
		if k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" || k == "Date" || !isToken(k) {
			continue
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(headerValue(v))
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("Date: ")
	bw.WriteString(date())
	bw.WriteString("\r\n")
	if te != "" {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if n >= 0 {
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.Itoa(n))
		bw.WriteString("\r\n")
	}
	if w.close {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// headerValue keeps a handler's value from breaking the head: CR and LF
// become spaces, as net/http does.
func headerValue(v string) string {
	for i := 0; i < len(v); i++ {
		if v[i] == '\r' || v[i] == '\n' {
			b := []byte(v)
			for j := range b {
				if b[j] == '\r' || b[j] == '\n' {
					b[j] = ' '
				}
			}
			return string(b)
		}
	}
	return v
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// date is the Date header's value, formatted once a second.
func date() string {
	now := time.Now().Unix()
	if d := cachedDate.Load(); d != nil && d.sec == now {
		return d.text
	}
	d := &dateText{sec: now, text: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	cachedDate.Store(d)
	return d.text
}

type dateText struct {
	sec  int64
	text string
}

var cachedDate atomic.Pointer[dateText]
