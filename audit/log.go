package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"encoding"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options tune a Log. The zero value is ready to use.
type Options struct {
	// FlushInterval bounds how long an event waits in memory before the
	// writer writes it; the syncer then fsyncs it. Default 50ms.
	FlushInterval time.Duration
	// MaxBatch: the writer starts at once when this many events wait;
	// default 256.
	MaxBatch int
	// MaxPending is the backlog at which Log waits for the writer instead
	// of queueing more: the disk has fallen this many events behind, or
	// keeps failing. Default 64 × MaxBatch. An audit record is never
	// dropped to make room.
	MaxPending int
	// Now stamps events whose Time is zero; default time.Now.
	Now func() time.Time
}

const (
	defaultFlushInterval = 50 * time.Millisecond
	defaultMaxBatch      = 256
	// writeChunk bounds the bytes the writer holds before a write(2).
	writeChunk = 256 << 10
)

// Log is an append-only, hash-chained audit log file. It is safe for
// concurrent use.
//
// Log encodes an event in the caller's goroutine and queues the bytes; it
// never waits for the disk (short of MaxPending). Two goroutines do the
// rest, as a pipelined group commit: the writer takes everything queued at
// most FlushInterval after the first event arrived (at once at MaxBatch),
// gives each line its seq and prev, hashes it and writes the lot; the
// syncer fsyncs what has been written and then replaces the .head
// sidecar, while the writer goes on writing.
type Log struct {
	path       string
	interval   time.Duration
	maxBatch   int
	maxPending int
	now        func() time.Time

	mu    sync.Mutex
	cond  sync.Cond // on mu; Log waits here at MaxPending
	queue queue     // encoded events waiting for the writer
	free  []*block  // blocks to reuse
	// closed: Log drops. Set under mu.
	closed bool

	wsig  chan struct{} // cap 1: work for the writer
	ssig  chan struct{} // cap 1: work for the syncer
	wstop chan struct{}
	sstop chan struct{}
	wdone chan struct{}
	sdone chan struct{}

	// wmu is held while writing; it guards the fields below.
	wmu    sync.Mutex
	w      writeTruncater // f, but tests put a failing one in
	seq    uint64
	prev   [sha256.Size]byte
	size   int64 // bytes of whole lines in the file
	out    []byte
	digest hash.Hash
	spare  []*block // the queue's other slice of blocks
	broken bool     // a failed write could not be cut back: nothing more is written

	// hmu guards the last line written, which the syncer makes durable.
	hmu       sync.Mutex
	wroteSeq  uint64
	wroteHash [sha256.Size]byte

	// smu is held while syncing; it guards the fields below.
	smu     sync.Mutex
	f       *os.File
	dir     *os.File
	synced  uint64 // seq of the last line fsynced and recorded in .head
	fclosed bool

	emu sync.Mutex
	err error // first error not yet returned by Flush or Close

	dropped atomic.Uint64
	syncs   atomic.Uint64 // fsyncs of the log file
}

// queue is encoded events, in blocks. Each event is the head and tail
// parts of its line (see appendHead), back to back in one block.
type queue struct {
	blocks []*block
	n      int // events
}

// blockSize is the usual size of a block; a bigger event gets a block of
// its own.
const blockSize = 64 << 10

// Blocks kept for reuse: up to maxFree while the writer is busy, trimmed
// to idleFree once a batch is small again.
const (
	maxFree  = 256
	idleFree = 4
)

type block struct {
	buf  []byte
	ends []partEnds // where each event's parts end in buf
}

// partEnds says where an event's parts end in its block's buf. The head
// part is followed by the tail part, then, if pre > 0, the marshalled
// SHA-256 state after the line's first pre bytes (all in the head part),
// which the writer continues from.
type partEnds struct{ head, tail, end, pre int }

// add appends an encoded event (see partEnds), taking a block from free if
// needed. Call with mu held.
func (l *Log) add(b []byte, head, tail, pre int) int {
	q := &l.queue
	var blk *block
	if k := len(q.blocks); k > 0 && len(q.blocks[k-1].buf)+len(b) <= cap(q.blocks[k-1].buf) {
		blk = q.blocks[k-1]
	} else {
		if k := len(l.free); k > 0 && len(b) <= blockSize {
			blk = l.free[k-1]
			l.free = l.free[:k-1]
		} else {
			blk = &block{buf: make([]byte, 0, max(blockSize, len(b))), ends: make([]partEnds, 0, 128)}
		}
		q.blocks = append(q.blocks, blk)
	}
	off := len(blk.buf)
	blk.buf = append(blk.buf, b...)
	blk.ends = append(blk.ends, partEnds{off + head, off + tail, off + len(b), pre})
	q.n++
	return q.n
}

// recycle keeps q's blocks for reuse and empties q. Call with mu held.
func (l *Log) recycle(q *queue) {
	for i, blk := range q.blocks {
		if len(l.free) < maxFree && cap(blk.buf) == blockSize {
			blk.buf, blk.ends = blk.buf[:0], blk.ends[:0]
			l.free = append(l.free, blk)
		}
		q.blocks[i] = nil
	}
	q.blocks, q.n = q.blocks[:0], 0
}

type writeTruncater interface {
	io.Writer
	Truncate(size int64) error
}

var _ Sink = (*Log)(nil)

// Open opens the log at path for appending, creating its directories
// (0700) and the file (0600) if needed. An existing file's last line gives
// the seq and prev to continue from; a last line that is not a complete
// line of this format is an error naming file:line. So is a file shorter
// than, or different from, its .head sidecar: Open will not extend a log
// that was cut back or edited at its end. Open does not verify the whole
// chain; VerifyFile does.
func Open(path string, opts Options) (*Log, error) {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = defaultFlushInterval
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = 64 * opts.MaxBatch
	}
	opts.MaxPending = max(opts.MaxPending, opts.MaxBatch)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{
		path:       path,
		interval:   opts.FlushInterval,
		maxBatch:   opts.MaxBatch,
		maxPending: opts.MaxPending,
		now:        opts.Now,
		wsig:       make(chan struct{}, 1),
		ssig:       make(chan struct{}, 1),
		wstop:      make(chan struct{}),
		sstop:      make(chan struct{}),
		wdone:      make(chan struct{}),
		sdone:      make(chan struct{}),
		f:          f,
		w:          f,
		digest:     sha256.New(),
	}
	l.cond.L = &l.mu
	if err := l.resume(); err != nil {
		f.Close()
		return nil, err
	}
	l.wroteSeq, l.wroteHash, l.synced = l.seq, l.prev, l.seq
	if l.dir, err = os.Open(filepath.Dir(path)); err == nil {
		err = l.dir.Sync() // make a new file's name durable
	}
	if err != nil {
		f.Close()
		if l.dir != nil {
			l.dir.Close()
		}
		return nil, fmt.Errorf("audit: %w", err)
	}
	go l.writer()
	go l.syncer()
	return l, nil
}

// resume reads the file's last line and its sidecar to continue the chain.
func (l *Log) resume() error {
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	size := st.Size()
	l.size = size
	if size > 0 {
		start, err := tailStart(l.f, size, 1)
		if err != nil {
			return fmt.Errorf("audit: %s: %w", l.path, err)
		}
		line := make([]byte, size-start)
		if _, err := l.f.ReadAt(line, start); err != nil {
			return fmt.Errorf("audit: %s: %w", l.path, err)
		}
		fail := func(format string, args ...any) error {
			n, err := countLines(l.f, start)
			if err != nil {
				return fmt.Errorf("audit: %s: %w", l.path, err)
			}
			return fmt.Errorf("audit: %s:%d: last line: %s; move the file aside, or remove the line if you know why it is broken", l.path, n+1, fmt.Sprintf(format, args...))
		}
		if line[len(line)-1] != '\n' {
			return fail("incomplete: no newline at the end (a write was cut short)")
		}
		line = line[:len(line)-1]
		seq, _, reason := parseLine(line)
		if reason != "" {
			return fail("%s", reason)
		}
		l.seq = seq
		l.prev = sha256.Sum256(line)
	}
	h, ok, err := readHead(l.path + ".head")
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if !ok {
		return nil
	}
	switch {
	case h.seq > l.seq:
		return fmt.Errorf("audit: %s: truncated: %s.head records %d lines but the last line has seq %d; the log was cut back, so it is not extended: move it and its .head aside", l.path, l.path, h.seq, l.seq)
	case h.seq == l.seq && h.hash != hex.EncodeToString(l.prev[:]):
		return fmt.Errorf("audit: %s: line %d: hash does not match %s.head: the last line was edited or replaced; move the log and its .head aside", l.path, l.seq, l.path)
	}
	return nil
}

// encoder is what Log needs to encode an event.
type encoder struct {
	buf []byte
	h   hash.Hash
}

var encoders = sync.Pool{New: func() any { return &encoder{buf: make([]byte, 0, 1024), h: sha256.New()} }}

// midstate says whether SHA-256 state can be carried from Log to the
// writer, so that callers hash what they can of a line in parallel.
var midstate = func() bool {
	h := sha256.New()
	_, a := h.(encoding.BinaryAppender)
	_, u := h.(encoding.BinaryUnmarshaler)
	return a && u
}()

// Log queues e for the writer. It waits only when MaxPending events are
// already queued. After Close, e is dropped and counted.
func (l *Log) Log(e Event) {
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	enc := encoders.Get().(*encoder)
	b := appendHead(enc.buf[:0], &e)
	head := len(b)
	b = appendTail(b, &e)
	tail := len(b)
	// The head part starts the line and does not depend on the order of
	// lines: hash its whole blocks here rather than in the writer.
	pre := head &^ (sha256.BlockSize - 1)
	if midstate && pre > 0 {
		enc.h.Reset()
		enc.h.Write(b[:pre])
		b, _ = enc.h.(encoding.BinaryAppender).AppendBinary(b)
	} else {
		pre = 0
	}

	l.mu.Lock()
	for l.queue.n >= l.maxPending && !l.closed {
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		l.dropped.Add(1)
	} else {
		n := l.add(b, head, tail, pre)
		l.mu.Unlock()
		if n == 1 || n >= l.maxBatch {
			signal(l.wsig)
		}
	}
	if cap(b) <= 64<<10 {
		enc.buf = b
		encoders.Put(enc)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Flush writes and fsyncs every event queued before it was called. It
// returns the first error since the previous Flush, from its own work or
// the background's. Events that failed to be written stay queued and are
// tried again.
func (l *Log) Flush() error {
	l.write(false)
	l.sync()
	return l.takeErr()
}

// Close writes and fsyncs what is queued, stops the writer and the syncer
// and closes the file. Events logged during or after Close are either
// written or dropped and counted by Dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errors.New("audit: log already closed")
	}
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	close(l.wstop)
	<-l.wdone
	l.write(true)
	close(l.sstop)
	<-l.sdone
	l.sync()

	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.smu.Lock()
	defer l.smu.Unlock()
	l.fclosed = true
	err := l.takeErr()
	if cerr := l.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("audit: %w", cerr)
	}
	l.dir.Close()
	return err
}

// Dropped reports how many events were not written: logged after Close,
// or still failing to be written when the log closed.
func (l *Log) Dropped() uint64 { return l.dropped.Load() }

// Path is the log file's path.
func (l *Log) Path() string { return l.path }

func (l *Log) setErr(err error) {
	l.emu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.emu.Unlock()
}

func (l *Log) takeErr() error {
	l.emu.Lock()
	defer l.emu.Unlock()
	err := l.err
	l.err = nil
	return err
}

// writer writes queued events at most interval after the first of them
// arrived, or at once when maxBatch are queued.
func (l *Log) writer() {
	defer close(l.wdone)
	t := time.NewTimer(time.Hour)
	t.Stop()
	wait := func(c <-chan struct{}) bool { // false: stop
		t.Reset(l.interval)
		defer t.Stop()
		select {
		case <-c:
		case <-t.C:
		case <-l.wstop:
			return false
		}
		return true
	}
	for {
		select {
		case <-l.wsig:
		case <-l.wstop:
			return
		}
		if !l.full() && !wait(l.wsig) {
			return
		}
		if !l.write(false) {
			// The events stay queued; try again after an interval.
			if !wait(nil) {
				return
			}
			signal(l.wsig)
		}
	}
}

func (l *Log) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queue.n >= l.maxBatch
}

// syncer fsyncs what the writer wrote, as often as the disk allows.
func (l *Log) syncer() {
	defer close(l.sdone)
	for {
		select {
		case <-l.ssig:
		case <-l.sstop:
			return
		}
		l.sync()
	}
}

// write writes the queued events and reports whether it succeeded. On
// failure the events are queued again in front, unless final (Close) or
// the file is broken, when they are dropped and counted.
func (l *Log) write(final bool) bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	q := l.queue
	l.queue = queue{blocks: l.spare[:0]}
	l.cond.Broadcast()
	l.mu.Unlock()
	if q.n == 0 || l.fclosedW() {
		l.spare = q.blocks[:0]
		return true
	}
	err := l.writeQueue(&q)
	if err == nil {
		l.hmu.Lock()
		l.wroteSeq, l.wroteHash = l.seq, l.prev
		l.hmu.Unlock()
		signal(l.ssig)
	} else {
		l.setErr(err)
		if !final && !l.broken {
			l.mu.Lock()
			l.queue.blocks = append(q.blocks, l.queue.blocks...)
			l.queue.n += q.n
			l.mu.Unlock()
			l.spare = nil
			return false
		}
		l.dropped.Add(uint64(q.n))
	}
	l.mu.Lock()
	small := q.n < l.maxBatch
	l.recycle(&q)
	if small && len(l.free) > idleFree {
		clear(l.free[idleFree:])
		l.free = l.free[:idleFree]
	}
	l.mu.Unlock()
	l.spare = q.blocks
	return err == nil
}

// fclosedW reports, under wmu, whether Close has closed the file.
func (l *Log) fclosedW() bool {
	l.smu.Lock()
	defer l.smu.Unlock()
	return l.fclosed
}

// writeQueue gives q's lines their seq and prev and appends them to the
// file. A failed write is cut back, so that the file stays whole lines.
func (l *Log) writeQueue(q *queue) error {
	if l.broken {
		return fmt.Errorf("audit: %s: not written: an earlier failed write could not be cut back", l.path)
	}
	seq, prev, size := l.seq, l.prev, l.size
	out := l.out[:0]
	for bi, blk := range q.blocks {
		start := 0
		for i, e := range blk.ends {
			line := len(out)
			seq++
			out = appendLine(out, blk.buf[start:e.head], seq, blk.buf[e.head:e.tail], &prev)
			if e.pre > 0 {
				if err := l.digest.(encoding.BinaryUnmarshaler).UnmarshalBinary(blk.buf[e.tail:e.end]); err != nil {
					panic("audit: sha256 state: " + err.Error()) // made by Log from the same type
				}
				l.digest.Write(out[line+e.pre:])
				l.digest.Sum(prev[:0])
			} else {
				prev = sha256.Sum256(out[line:])
			}
			out = append(out, '\n')
			start = e.end
			if len(out) < writeChunk && (bi < len(q.blocks)-1 || i < len(blk.ends)-1) {
				continue
			}
			n, err := l.w.Write(out)
			size += int64(n)
			if err != nil {
				if terr := l.w.Truncate(l.size); terr != nil {
					l.broken = true
					return fmt.Errorf("audit: %s: write: %v; cutting back the partial write failed too, so nothing more is written: %v", l.path, err, terr)
				}
				return fmt.Errorf("audit: %s: write: %w", l.path, err)
			}
			out = out[:0]
		}
	}
	if cap(out) <= 2*writeChunk {
		l.out = out
	}
	l.seq, l.prev, l.size = seq, prev, size
	return nil
}

// sync fsyncs the file up to the last line written, then records that line
// in the .head sidecar.
func (l *Log) sync() {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.hmu.Lock()
	seq, hash := l.wroteSeq, l.wroteHash
	l.hmu.Unlock()
	if seq <= l.synced || l.fclosed {
		return
	}
	if err := l.f.Sync(); err != nil {
		l.setErr(fmt.Errorf("audit: %s: fsync: %w", l.path, err))
		return
	}
	l.syncs.Add(1)
	if err := l.writeHead(seq, &hash); err != nil {
		l.setErr(err)
		return
	}
	l.synced = seq
}

// writeHead replaces <path>.head with seq and hash, atomically.
func (l *Log) writeHead(seq uint64, hash *[sha256.Size]byte) error {
	b := make([]byte, 0, 96)
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"hash":"`...)
	b = hex.AppendEncode(b, hash[:])
	b = append(b, "\"}\n"...)
	head := l.path + ".head"
	tmp := head + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, head)
	}
	if err == nil {
		err = l.dir.Sync()
	}
	if err != nil {
		return fmt.Errorf("audit: %s: %w", head, err)
	}
	return nil
}

// head is a .head sidecar.
type head struct {
	seq  uint64
	hash string
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
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return head{}, false, fmt.Errorf("%s: not a head sidecar: %v", path, err)
	}
	if v.Seq == nil || !isHash(v.Hash) {
		return head{}, false, fmt.Errorf(`%s: not a head sidecar: want {"seq":N,"hash":"<64 hex digits>"}`, path)
	}
	return head{*v.Seq, v.Hash}, true, nil
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

// TailFile returns the last n lines of the file at path, as they are.
func TailFile(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	start, err := tailStart(f, st.Size(), n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make([]byte, st.Size()-start)
	if _, err := f.ReadAt(out, start); err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
