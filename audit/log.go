package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	// FlushInterval bounds how long an event waits in memory before it is
	// written and synced with the events around it. Default 100ms: each
	// group costs two fsyncs, whose CPU on a small machine is a fixed cost
	// per second, and a tenth of a second is what a crash may lose.
	FlushInterval time.Duration
	// MaxBatch: at this many waiting events the writer starts at once
	// instead of waiting out FlushInterval. Default 4096: under load a group
	// is about FlushInterval of events, not a fixed few, so the fsyncs
	// per second stay bounded whatever the call rate.
	MaxBatch int
	// MaxPending is the backlog at which Log waits instead of queueing
	// more: the disk has fallen this many events behind, or keeps failing.
	// Default 16384, or MaxBatch if larger. An audit record is never
	// dropped to make room.
	MaxPending int
	// Now stamps events whose Time is zero; default time.Now.
	Now func() time.Time
	// MaxSize: a file that would grow past this many bytes is moved aside
	// and the chain continues in a new one (see rotate.go). 0: never. A
	// single group of lines larger than MaxSize still goes to one file.
	MaxSize int64
	// MaxFiles is how many moved-aside files are kept; the oldest are
	// deleted. Default 10.
	MaxFiles int
	// Reserve is how many bytes of disk space are kept allocated ahead of
	// the file's end (see Healthy and admit.go): it bounds the records
	// promised and not yet written, so about Reserve/2 KiB calls may be
	// running at once before more wait. Default 4 MiB, at least 64 KiB;
	// negative: none (calls are admitted on health alone).
	Reserve int64
	// Replica names the replica writing the log, in every record (each
	// replica of a scaled-out capgate writes its own log); "" for none.
	Replica string
	// HeadKey, when set (HeadKey of capgate's token secret), MACs every
	// .head sidecar, and Open refuses a log whose head is missing or does
	// not verify under it (see headkey.go).
	HeadKey []byte
	// OnHealth is called, from the writer, when the log turns unhealthy
	// (with why) and when it recovers (with nil): once per change, not per
	// event. It must not call the Log.
	OnHealth func(error)
}

const (
	defaultFlushInterval = 100 * time.Millisecond
	defaultMaxBatch      = 4096
	defaultMaxPending    = 16384
	defaultMaxFiles      = 10
	// chunkSize is about how many bytes of lines go to one write(2).
	chunkSize = 256 << 10
	// maxOutbox is about how many bytes of lines, hashed and waiting to be
	// written, the writer runs ahead of the disk.
	maxOutbox = 16 * chunkSize
	// headEvery: the .head sidecar is replaced at most this often (and at
	// every Flush, rotation and Close). Each replacement is a file made,
	// fsynced and renamed, which at one group every FlushInterval was
	// most of the log's CPU per second; the head is a hint that lags the
	// log anyway (see writeHead).
	headEvery = time.Second
)

// Log is an append-only, hash-chained audit log file. It is safe for
// concurrent use.
//
// Events go through three stages, each ahead of the next so that none
// waits for the disk unless the disk falls far behind:
//
//   - Log encodes the event in the caller's goroutine, all but seq and
//     prev, and queues the bytes.
//   - The writer takes everything queued at most FlushInterval after the
//     first event arrived (at once when MaxBatch wait), gives each line
//     its seq and prev, hashes it, and passes the lines on in chunks.
//   - The I/O goroutine, holding an exclusive flock on the file, writes the
//     chunks, fsyncs the file once for all of them (group commit), then
//     replaces the .head sidecar. If another Log appended since, it first
//     chains the chunks anew to the file's last line.
type Log struct {
	path       string
	interval   time.Duration
	maxBatch   int
	maxPending int
	now        func() time.Time
	replica    string // Options.Replica
	maxSize    int64
	maxFiles   int
	reserve    int64
	onHealth   func(error)
	headKey    []byte // MACs the .head sidecar; nil: unkeyed

	// Queue: encoded events waiting for the writer.
	mu     sync.Mutex
	cond   sync.Cond // on mu; Log waits here at MaxPending
	queue  queue
	free   []*block // blocks to reuse
	closed bool     // Log drops

	// Writer: wmu is held while lines are made; it guards the chain.
	wmu   sync.Mutex
	seq   uint64
	prev  [sha256.Size]byte
	spare []*block

	// Outbox: chunks of lines made, waiting to be written.
	omu    sync.Mutex
	ocond  sync.Cond // on omu; the writer waits here when the outbox is full
	outbox []*chunk
	obytes int
	ofree  []*chunk
	ostop  bool // Close: the writer must not wait for room
	// The last line written, for the writer to chain from when the outbox
	// is empty: it differs from the writer's own only when another Log
	// (another process) appended to the file meanwhile.
	tailSeq  uint64
	tailHash [sha256.Size]byte

	// I/O: iomu is held while writing and syncing; it guards the fields
	// below.
	iomu      sync.Mutex
	f         *os.File
	w         writeTruncater // f; tests put a failing one in
	dir       *os.File
	size      int64 // bytes of whole lines in the file
	wroteSeq  uint64
	wroteHash [sha256.Size]byte
	synced    uint64 // last line fsynced
	headSeq   uint64 // last line recorded in .head by this Log
	headAt    time.Time
	headEvery time.Duration // headEvery; tests shorten or lengthen it
	fclosed   bool
	rebuf     []byte // for rechain
	noFalloc  bool   // the filesystem cannot reserve space
	reserved  int64  // where the space reserved in f ends
	ahead     int64  // reserved-size as last counted in budget

	broken     atomic.Bool // a failed write could not be cut back: nothing more is written
	sick       atomic.Pointer[error]
	unrecorded atomic.Uint64
	budget     atomic.Int64 // see admit.go
	waiters    atomic.Int32 // waiting in waitBudget

	wsig  chan struct{} // cap 1: work for the writer
	iosig chan struct{} // cap 1: work for the I/O goroutine
	wstop chan struct{}
	iostp chan struct{}
	wdone chan struct{}
	iodon chan struct{}

	emu sync.Mutex
	err error // first error not yet returned by Flush or Close

	dropped atomic.Uint64
	syncs   atomic.Uint64 // fsyncs of the log file
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
		opts.MaxPending = defaultMaxPending
	}
	opts.MaxPending = max(opts.MaxPending, opts.MaxBatch)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = defaultMaxFiles
	}
	if opts.Reserve == 0 {
		opts.Reserve = defaultReserve
	}
	if opts.Reserve > 0 {
		// Less would make Admit wait for space that never comes.
		opts.Reserve = max(opts.Reserve, minReserve)
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
		replica:    opts.Replica,
		maxSize:    max(opts.MaxSize, 0),
		maxFiles:   opts.MaxFiles,
		reserve:    opts.Reserve,
		onHealth:   opts.OnHealth,
		headKey:    opts.HeadKey,
		headEvery:  headEvery,
		f:          f,
		w:          f,
		wsig:       make(chan struct{}, 1),
		iosig:      make(chan struct{}, 1),
		wstop:      make(chan struct{}),
		iostp:      make(chan struct{}),
		wdone:      make(chan struct{}),
		iodon:      make(chan struct{}),
	}
	l.cond.L = &l.mu
	l.ocond.L = &l.omu
	if err := l.resume(); err != nil {
		f.Close()
		return nil, err
	}
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
	if l.reserve <= 0 {
		l.budget.Store(unlimited)
	}
	// A disk already full is no reason not to start: the log starts
	// unhealthy, calls are refused, and the writer retries.
	if err := l.reserveAhead(l.f, l.size, &l.reserved); err != nil {
		l.setHealth(err)
		signal(l.iosig)
	}
	l.account(0)
	go l.writer()
	go l.ioer()
	return l, nil
}

// resume reads the file's last line and its sidecar to continue the chain.
func (l *Log) resume() error {
	unlock, err := lockFile(l.f, lockEx)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", l.path, err)
	}
	defer unlock()
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	l.size = st.Size()
	if l.seq, l.prev, err = readTail(l.f, l.size, l.path); err != nil {
		return err
	}
	if l.size == 0 { // just rotated, perhaps
		if l.seq, l.prev, err = lastRotated(l.path); err != nil {
			return err
		}
	}
	l.wroteSeq, l.wroteHash, l.synced, l.headSeq = l.seq, l.prev, l.seq, l.seq
	l.tailSeq, l.tailHash = l.seq, l.prev
	h, ok, err := readHead(l.path + ".head")
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if l.headKey != nil {
		// Keyed, a log has a head from its first moment on (written now
		// for a new one), so a missing head is one that was removed.
		switch {
		case !ok && l.seq == 0:
			return l.writeHead(0, &l.prev)
		case !ok:
			return fmt.Errorf("audit: %s: it has %d lines but no %s.head: the head was removed (with lines cut off the end, perhaps), so the log is not extended: check it with capgate audit verify, then move it aside", l.path, l.seq, l.path)
		}
		if err := h.checkMAC(l.headKey, l.path+".head"); err != nil {
			return fmt.Errorf("audit: %s: %w; the log is not extended: check it with capgate audit verify, then move it and its .head aside", l.path, err)
		}
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

// readTail returns the seq and hash of the last line of f, of size bytes;
// 0 and the zero hash for an empty file. A last line that is incomplete or
// not a record is an error naming path:line.
func readTail(f *os.File, size int64, path string) (seq uint64, hash [sha256.Size]byte, err error) {
	if size == 0 {
		return 0, hash, nil
	}
	start, err := tailStart(f, size, 1)
	if err != nil {
		return 0, hash, fmt.Errorf("audit: %s: %w", path, err)
	}
	line := make([]byte, size-start)
	if _, err := f.ReadAt(line, start); err != nil {
		return 0, hash, fmt.Errorf("audit: %s: %w", path, err)
	}
	fail := func(reason string) error {
		n, err := countLines(f, start)
		if err != nil {
			return fmt.Errorf("audit: %s: %w", path, err)
		}
		return fmt.Errorf("audit: %s:%d: last line: %s; move the file aside, or remove the line if you know why it is broken", path, n+1, reason)
	}
	if line[len(line)-1] != '\n' {
		return 0, hash, fail("incomplete: no newline at the end (a write was cut short)")
	}
	line = line[:len(line)-1]
	seq, _, reason := parseLine(line)
	if reason != "" {
		return 0, hash, fail(reason)
	}
	return seq, sha256.Sum256(line), nil
}

// Log queues e for the writer. It waits when MaxPending events are
// already queued, or while the log is healthy and its reserved space is
// all promised (see admit.go). While the log is unhealthy, an event no
// Ticket covers is queued only if reserved space is left for it; if not
// it is counted (Unrecorded). After Close, e is dropped and counted.
func (l *Log) Log(e Event) { l.log(&e, nil) }

// log takes e by pointer and leaves it as it is: an Event is some 500
// bytes, and a call's records passed by value were copied several times
// each on their way here.
func (l *Log) log(e *Event, t *Ticket) {
	if e.Gate == GateAudit && l.sick.Load() != nil {
		l.unrecorded.Add(1)
		return
	}
	if e.Time.IsZero() || e.Replica == "" {
		c := *e
		if c.Time.IsZero() {
			c.Time = l.now()
		}
		if c.Replica == "" {
			c.Replica = l.replica
		}
		e = &c
	}
	bp := encBufs.Get().(*[]byte)
	b, head := encode(*bp, e)
	if cost := int64(len(b)) + lineOverhead; t != nil && t.left >= cost {
		t.left -= cost
	} else if !l.take(cost) {
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			l.dropped.Add(1)
		} else {
			l.unrecorded.Add(1)
		}
		l.putBuf(bp, b)
		return
	}

	l.mu.Lock()
	for l.queue.n >= l.maxPending && !l.closed {
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		l.dropped.Add(1)
	} else {
		n := l.add(b, head)
		l.mu.Unlock()
		if n == 1 || n >= l.maxBatch {
			signal(l.wsig)
		}
	}
	l.putBuf(bp, b)
}

func (l *Log) putBuf(bp *[]byte, b []byte) {
	if cap(b) <= 64<<10 {
		*bp = b
		encBufs.Put(bp)
	}
}

// encBufs holds Log's encoding buffers.
var encBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Flush writes and fsyncs every event logged before it was called. It
// returns the first error since the previous Flush, from its own work or
// the background's. Events that failed to be written stay pending and are
// tried again.
func (l *Log) Flush() error {
	l.write()
	l.io(true)
	return l.takeErr()
}

// Close writes and fsyncs what is pending, stops the goroutines and closes
// the file. Events logged during or after Close are either written or
// dropped and counted by Dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errors.New("audit: log already closed")
	}
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	l.omu.Lock()
	l.ostop = true
	l.ocond.Broadcast()
	l.omu.Unlock()

	close(l.wstop)
	<-l.wdone
	l.write()
	close(l.iostp)
	<-l.iodon
	if !l.io(true) {
		l.omu.Lock()
		var last *chunk
		for _, c := range l.outbox {
			l.dropped.Add(uint64(len(c.lines)))
			last = c
		}
		l.outbox = nil
		l.omu.Unlock()
		// The dropped lines were chained already: a head naming the last
		// of them makes VerifyFile report the log as cut short, which it
		// is, rather than intact. (If the head cannot be written either,
		// Close's error is all that says so.)
		if last != nil {
			if err := l.writeHead(last.seq, &last.hash); err != nil {
				l.setErr(err)
			}
		}
	}

	l.iomu.Lock()
	defer l.iomu.Unlock()
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

// writer makes lines of queued events at most interval after the first of
// them arrived, or at once when maxBatch are queued.
func (l *Log) writer() {
	defer close(l.wdone)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-l.wsig:
		case <-l.wstop:
			return
		}
		if !l.full() {
			t.Reset(l.interval)
			select {
			case <-l.wsig:
			case <-t.C:
			case <-l.wstop:
				return
			}
			t.Stop()
		}
		l.waitRoom()
		l.write()
	}
}

// waitRoom waits until the I/O goroutine is less than maxOutbox behind,
// or Close. The writer waits here, not holding wmu, so that Flush never
// waits for the disk to catch up.
func (l *Log) waitRoom() {
	l.omu.Lock()
	for l.obytes >= maxOutbox && !l.ostop {
		l.ocond.Wait()
	}
	l.omu.Unlock()
}

// full reports whether the writer should start now: maxBatch events
// wait, or callers wait for reserved space, which comes back only as
// queued records are written.
func (l *Log) full() bool {
	if l.waiters.Load() > 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queue.n >= l.maxBatch
}

// ioer writes and syncs what the writer made, as soon as it can; after a
// failure it tries again every interval.
func (l *Log) ioer() {
	defer close(l.iodon)
	t := time.NewTimer(time.Hour)
	t.Stop()
	// head fires when a head held back by headEvery is due, so that a
	// burst followed by silence is not left out of .head until Close.
	head := time.NewTimer(time.Hour)
	head.Stop()
	for {
		select {
		case <-l.iosig:
		case <-head.C:
		case <-l.iostp:
			return
		}
		if !l.io(false) {
			t.Reset(l.interval)
			select {
			case <-t.C:
			case <-l.iostp:
				return
			}
			signal(l.iosig)
		}
		if due := l.headDue(); due > 0 {
			head.Reset(due)
		}
	}
}

// headDue is how long until the head held back by headEvery is due; 0
// when .head names every line synced.
func (l *Log) headDue() time.Duration {
	l.iomu.Lock()
	defer l.iomu.Unlock()
	if l.fclosed || l.headSeq >= l.synced {
		return 0
	}
	return max(l.headEvery-time.Since(l.headAt), time.Millisecond)
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

// Blocks and chunks kept for reuse: up to maxFree while busy, trimmed to
// idleFree once a batch is small again.
const (
	maxFree  = 256
	idleFree = 4
)

type block struct {
	buf  []byte
	ends []partEnds // where each event's parts end in buf
}

type partEnds struct{ head, tail int }

// add appends an encoded event whose head part is b[:head], taking a
// block from free if needed. Call with mu held.
func (l *Log) add(b []byte, head int) int {
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
	blk.ends = append(blk.ends, partEnds{off + head, off + len(b)})
	q.n++
	return q.n
}

// chunk is lines made by the writer, for one write(2), chained to the line
// baseSeq, whose hash is base.
type chunk struct {
	buf     []byte
	lines   []lineIdx
	cost    int64 // bytes of budget promised to its lines
	baseSeq uint64
	base    [sha256.Size]byte
	seq     uint64            // the last line's seq
	hash    [sha256.Size]byte // and hash
}

// lineIdx locates a line in its chunk: its seq digits, and its end, after
// the newline. Its prev is the 64 bytes before the closing `"}` and newline.
type lineIdx struct{ seqStart, seqEnd, end int }

// prevEnd is how far before a line's end its prev begins: 64 hex digits,
// `"}` and the newline.
const prevEnd = 2*sha256.Size + 3

// rechain gives c's lines new seqs and prevs, chained to the line seq whose
// hash is hash, building them in buf, and returns c's old buffer.
func rechain(c *chunk, seq uint64, hash [sha256.Size]byte, buf []byte) []byte {
	c.baseSeq, c.base = seq, hash
	out := buf[:0]
	start := 0
	for i, li := range c.lines {
		line := len(out)
		seq++
		var ss, se int
		out, ss, se = appendLine(out, c.buf[start:li.seqStart], seq, c.buf[li.seqEnd:li.end-prevEnd], &hash)
		hash = sha256.Sum256(out[line:])
		out = append(out, '\n')
		c.lines[i] = lineIdx{ss, se, len(out)}
		start = li.end
	}
	c.seq, c.hash = seq, hash
	old := c.buf
	c.buf = out
	return old
}

// write makes lines of the queued events and puts them in the outbox.
func (l *Log) write() {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	q := l.queue
	l.queue = queue{blocks: l.spare[:0]}
	l.cond.Broadcast()
	l.mu.Unlock()
	if q.n == 0 {
		l.spare = q.blocks[:0]
		return
	}
	if l.broken.Load() {
		l.setErr(fmt.Errorf("audit: %s: not written: an earlier failed write could not be cut back", l.path))
		l.dropped.Add(uint64(q.n))
	} else {
		l.omu.Lock()
		if len(l.outbox) == 0 {
			l.seq, l.prev = l.tailSeq, l.tailHash
		}
		l.omu.Unlock()
		seq, prev := l.seq, l.prev
		c := l.newChunk()
		c.baseSeq, c.base = seq, prev
		for bi, blk := range q.blocks {
			start := 0
			for i, e := range blk.ends {
				line := len(c.buf)
				seq++
				var ss, se int
				c.buf, ss, se = appendLine(c.buf, blk.buf[start:e.head], seq, blk.buf[e.head:e.tail], &prev)
				prev = sha256.Sum256(c.buf[line:])
				c.buf = append(c.buf, '\n')
				c.lines = append(c.lines, lineIdx{ss, se, len(c.buf)})
				c.cost += int64(e.tail-start) + lineOverhead
				start = e.tail
				if len(c.buf) >= chunkSize || (bi == len(q.blocks)-1 && i == len(blk.ends)-1) {
					c.seq, c.hash = seq, prev
					l.post(c)
					c = l.newChunk()
					c.baseSeq, c.base = seq, prev
				}
			}
		}
		l.seq, l.prev = seq, prev
		l.freeChunk(c)
		signal(l.iosig)
	}
	l.mu.Lock()
	l.recycle(&q)
	l.mu.Unlock()
	l.spare = q.blocks
}

// recycle keeps q's blocks for reuse and empties q. Call with mu held.
func (l *Log) recycle(q *queue) {
	small := q.n < l.maxBatch
	for i, blk := range q.blocks {
		if len(l.free) < maxFree && cap(blk.buf) == blockSize {
			blk.buf, blk.ends = blk.buf[:0], blk.ends[:0]
			l.free = append(l.free, blk)
		}
		q.blocks[i] = nil
	}
	q.blocks, q.n = q.blocks[:0], 0
	if small && len(l.free) > idleFree {
		clear(l.free[idleFree:])
		l.free = l.free[:idleFree]
	}
}

func (l *Log) newChunk() *chunk {
	l.omu.Lock()
	defer l.omu.Unlock()
	if k := len(l.ofree); k > 0 {
		c := l.ofree[k-1]
		l.ofree = l.ofree[:k-1]
		return c
	}
	return &chunk{buf: make([]byte, 0, chunkSize+4<<10)}
}

// freeChunkLocked keeps c for reuse. Call with omu held.
func (l *Log) freeChunkLocked(c *chunk) {
	if len(l.ofree) < maxFree/4 && cap(c.buf) <= 2*chunkSize {
		c.buf, c.lines, c.cost = c.buf[:0], c.lines[:0], 0
		l.ofree = append(l.ofree, c)
	}
}

func (l *Log) freeChunk(c *chunk) {
	l.omu.Lock()
	l.freeChunkLocked(c)
	l.omu.Unlock()
}

// post appends c to the outbox.
func (l *Log) post(c *chunk) {
	l.omu.Lock()
	l.outbox = append(l.outbox, c)
	l.obytes += len(c.buf)
	n := len(l.outbox)
	l.omu.Unlock()
	if n == 1 {
		signal(l.iosig)
	}
}

// io writes the outbox's chunks in order, then fsyncs the file and records
// the last line in the .head sidecar, then reserves disk space ahead of
// the file's end. It reports whether all went well, and sets the log's
// health (Healthy) to match: it is called again every FlushInterval while
// not, even with nothing to write, so that health comes back with the
// disk space.
//
// It holds an exclusive flock on the file meanwhile, so that several Logs,
// in several processes, can share one file: if the file has grown since
// this Log last wrote, its lines are chained anew to the last line there.
//
// A chunk that fails to be written is cut back off the file and stays
// first in the outbox, to be tried again with the same seqs and prevs, so
// the chain on disk never skips a record. If it cannot be cut back the log
// is broken, and what the outbox holds is dropped and counted.
func (l *Log) io(forceHead bool) bool {
	l.iomu.Lock()
	defer l.iomu.Unlock()
	if l.fclosed {
		return true
	}
	l.omu.Lock()
	idle := len(l.outbox) == 0
	l.omu.Unlock()
	if idle && l.wroteSeq <= l.synced && l.sick.Load() == nil &&
		(l.headSeq >= l.synced || !(forceHead || time.Since(l.headAt) >= l.headEvery)) {
		return true
	}
	if l.broken.Load() {
		l.setHealth(fmt.Errorf("audit: %s: a failed write could not be cut back off the file, so nothing more is written; move the log aside and restart", l.path))
		return false
	}
	if _, err := lockFile(l.f, lockEx); err != nil {
		err = fmt.Errorf("audit: %s: %w", l.path, err)
		l.setErr(err)
		l.setHealth(err)
		return false
	}
	defer func() { unlockFile(l.f) }() // l.f as it is then: rotation may swap in a new file, locked
	err := l.ioLocked(idle, forceHead)
	l.account(0)
	if err != nil {
		l.setErr(err)
		l.setHealth(err)
		return false
	}
	// Only now, with the space allocated, does the budget grow.
	err = l.reserveAhead(l.f, l.size, &l.reserved)
	l.account(0)
	if err != nil {
		l.setHealth(err)
		return false
	}
	l.setHealth(nil)
	return true
}

// ioLocked is io's work under the flock; forceHead replaces .head even
// if it was replaced less than headEvery ago.
func (l *Log) ioLocked(idle, forceHead bool) error {
	if !idle {
		if err := l.follow(); err != nil {
			return err
		}
		st, err := l.f.Stat()
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		if st.Size() < l.size {
			return fmt.Errorf("audit: %s: the file was cut back from %d to %d bytes behind this Log's back; not extending it", l.path, l.size, st.Size())
		}
		if st.Size() > l.size { // another Log wrote
			seq, hash, err := readTail(l.f, st.Size(), l.path)
			if err != nil {
				return err
			}
			l.size, l.wroteSeq, l.wroteHash = st.Size(), seq, hash
			l.synced = seq // the other Log synced its lines before it unlocked
			l.account(0)   // it wrote into the space reserved here
		}
	}
	var rotErr error
	for {
		l.omu.Lock()
		if len(l.outbox) == 0 {
			l.omu.Unlock()
			break
		}
		c := l.outbox[0]
		l.omu.Unlock()
		if c.baseSeq != l.wroteSeq || c.base != l.wroteHash {
			l.rebuf = rechain(c, l.wroteSeq, l.wroteHash, l.rebuf)
		}
		if l.maxSize > 0 && l.size > 0 && l.size+int64(len(c.buf)) > l.maxSize && rotErr == nil {
			// Without room for a new file, the lines go on in this one:
			// its reservation holds them.
			rotErr = l.rotate()
		}
		n, err := l.w.Write(c.buf)
		if err != nil {
			if n > 0 {
				if terr := l.w.Truncate(l.size); terr != nil {
					l.broken.Store(true)
					l.omu.Lock()
					for _, c := range l.outbox {
						l.dropped.Add(uint64(len(c.lines)))
					}
					clear(l.outbox)
					l.outbox, l.obytes = l.outbox[:0], 0
					l.ocond.Broadcast()
					l.omu.Unlock()
					return fmt.Errorf("audit: %s: write: %v; cutting back the partial write failed too, so nothing more is written: %v", l.path, err, terr)
				}
			}
			if n > 0 {
				l.reserved = l.size // the cut freed the space past the end
				l.account(0)
			}
			return fmt.Errorf("audit: %s: write: %w", l.path, err)
		}
		l.size += int64(n)
		l.account(c.cost) // the lines took their promised space
		l.wroteSeq, l.wroteHash = c.seq, c.hash
		l.omu.Lock()
		l.tailSeq, l.tailHash = c.seq, c.hash
		l.outbox[0] = nil
		l.outbox = l.outbox[1:]
		l.obytes -= len(c.buf)
		l.freeChunkLocked(c)
		l.ocond.Broadcast()
		l.omu.Unlock()
	}
	if l.wroteSeq > l.synced {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("audit: %s: fsync: %w", l.path, err)
		}
		l.syncs.Add(1)
		l.synced = l.wroteSeq
	}
	// The lines are durable now. The sidecar is a hint that lags behind
	// anyway (VerifyFile accepts a log longer than it), so it is replaced
	// at most every headEvery, and failing to replace it refuses no call:
	// Flush and Close report it, and the next group tries again.
	if l.headSeq < l.synced && (forceHead || time.Since(l.headAt) >= l.headEvery) {
		if err := l.writeHead(l.synced, &l.wroteHash); err != nil {
			l.setErr(err)
		}
	}
	return rotErr
}

// writeHead replaces <path>.head with seq and hash, atomically.
func (l *Log) writeHead(seq uint64, hash *[sha256.Size]byte) error {
	b := make([]byte, 0, 96)
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"hash":"`...)
	b = hex.AppendEncode(b, hash[:])
	if l.headKey != nil {
		b = append(b, `","mac":"`...)
		b = append(b, headMAC(l.headKey, seq, hex.EncodeToString(hash[:]))...)
	}
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
	// The rename is not synced: a crash that loses it leaves the previous
	// head, which lags behind the log, and a head only refuses a log
	// shorter than it says. One fsync fewer per group.
	if err == nil {
		err = os.Rename(tmp, head)
	}
	if err != nil {
		return fmt.Errorf("audit: %s: %w", head, err)
	}
	l.headSeq, l.headAt = seq, time.Now()
	return nil
}
