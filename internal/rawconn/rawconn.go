// Package rawconn makes socket reads and writes without telling the Go
// scheduler that a system call is under way.
//
// Go's net package enters every read and write through the scheduler's
// system-call path, which wakes the runtime's monitor thread whenever it
// sleeps. On a proxy that is idle between short calls, those wake-ups and
// the thread switches after them cost more CPU than the work itself. A
// socket here is non-blocking, so the call never blocks: it reads or
// writes what it can or says EAGAIN, and the wait for readiness still goes
// through the netpoller (deadlines included) by way of syscall.RawConn.
package rawconn

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a TCP or Unix connection whose Read and Write are raw system
// calls. Everything else (deadlines, Close, addresses) is the wrapped
// connection's.
type Conn struct {
	net.Conn
	rc      syscall.RawConn
	request []byte // for the next Read to write first; see WriteBeforeRead

	// The state of the Read and the Write under way, and the functions
	// that RawConn calls with it, made once: a closure made per call would
	// put its variables on the heap.
	rmu            sync.Mutex
	rd             readOp
	readFn, exchFn func(fd uintptr) bool
	wmu            sync.Mutex
	wr             writeOp
	writeFn        func(fd uintptr) bool
}

type readOp struct {
	p     []byte
	n     uintptr
	errno syscall.Errno
	// For an exchange: the request, how much of it is written, and how
	// far it got.
	w                   []byte
	done                int
	werrno              syscall.Errno
	probed, sent, spoke bool
}

type writeOp struct {
	p     []byte
	done  int
	errno syscall.Errno
}

// Wrap returns c with raw reads and writes when c is a TCP or Unix
// connection, and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	rw := &Conn{Conn: c, rc: rc}
	rw.readFn, rw.exchFn, rw.writeFn = rw.read, rw.exch, rw.write
	return rw
}

// Read reads like net.Conn's Read.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.request != nil {
		return c.exchange(p)
	}
	return c.readLocked(p)
}

func (c *Conn) readLocked(p []byte) (int, error) {
	r := &c.rd
	defer func() { r.p = nil }()
	for {
		r.p, r.n, r.errno = p, 0, 0
		err := c.rc.Read(c.readFn)
		switch {
		case err != nil:
			return 0, opError("read", c.Conn, err)
		case r.errno == syscall.EINTR:
			continue
		case r.errno != 0:
			return 0, opError("read", c.Conn, r.errno)
		case r.n == 0:
			return 0, io.EOF
		}
		return int(r.n), nil
	}
}

func (c *Conn) read(fd uintptr) bool {
	r := &c.rd
	r.n, _, r.errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.p[0])), uintptr(len(r.p)))
	return r.errno != syscall.EAGAIN
}

// ErrNotSent is what Read returns when the peer had closed the connection,
// or sent something unasked, before the bytes of WriteBeforeRead went out:
// none did, so the request may be sent again on another connection.
var ErrNotSent = errors.New("rawconn: the peer closed the connection or spoke first; the request was not sent")

// WriteBeforeRead has the next Read write p before it reads: a client's
// request, whose answer that Read waits for. p must not change until
// then.
//
// A read on its own begins with a read attempt, because the netpoller's
// record of readiness is reset when it begins and whatever came before
// would otherwise go unnoticed. That attempt is all but certain to find
// nothing when the answer to a request just written is awaited, and on a
// machine where a system call is dear it is worth saving: here one
// non-consuming probe, which also finds a connection the peer closed while
// it was idle, comes before the write, and the wait after the write needs
// no second look.
func (c *Conn) WriteBeforeRead(p []byte) { c.request = p }

// exchange writes c.request and reads the answer into p, in one wait.
func (c *Conn) exchange(p []byte) (int, error) {
	r := &c.rd
	*r = readOp{p: p, w: c.request}
	c.request = nil
	defer func() { r.p, r.w = nil, nil }()
	err := c.rc.Read(c.exchFn)
	switch {
	case err != nil:
		return 0, opError("read", c.Conn, err)
	case r.spoke:
		return 0, ErrNotSent
	case r.werrno != 0:
		return 0, opError("write", c.Conn, r.werrno)
	case !r.sent:
		if _, err := c.Write(r.w[r.done:]); err != nil {
			return 0, err
		}
		return c.readLocked(p)
	case r.errno == syscall.EINTR:
		return c.readLocked(p)
	case r.errno != 0:
		return 0, opError("read", c.Conn, r.errno)
	case r.n == 0:
		return 0, io.EOF
	}
	return int(r.n), nil
}

func (c *Conn) exch(fd uintptr) bool {
	r := &c.rd
	if r.sent {
		return c.read(fd)
	}
	if !r.probed {
		var b [1]byte
		e := syscall.EINTR
		for e == syscall.EINTR {
			_, _, e = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		}
		if e != syscall.EAGAIN {
			r.spoke = true
			return true
		}
		r.probed = true
	}
	for r.done < len(r.w) {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&r.w[r.done])), uintptr(len(r.w)-r.done))
		switch e {
		case 0:
			r.done += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true // the rest waits for room, in exchange
		default:
			r.werrno = e
			return true
		}
	}
	r.sent = true
	return false // the answer cannot have come before the request
}

// Write writes all of p like net.Conn's Write.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	w := &c.wr
	*w = writeOp{p: p}
	defer func() { w.p = nil }()
	err := c.rc.Write(c.writeFn)
	switch {
	case err != nil:
		return w.done, opError("write", c.Conn, err)
	case w.errno != 0:
		return w.done, opError("write", c.Conn, w.errno)
	}
	return w.done, nil
}

func (c *Conn) write(fd uintptr) bool {
	w := &c.wr
	for w.done < len(w.p) {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&w.p[w.done])), uintptr(len(w.p)-w.done))
		switch e {
		case 0:
			w.done += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			w.errno = e
			return true
		}
	}
	return true
}

// CloseWrite shuts down the writing side, as net/http's server does
// before it closes a connection.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func opError(op string, c net.Conn, err error) error {
	if _, ok := err.(*net.OpError); ok {
		return err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Listener accepts connections with raw reads and writes.
type Listener struct{ net.Listener }

// Accept waits for the next connection.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// Peek reports, without reading anything, whether the peer has closed
// the connection or sent bytes. With wait it blocks until one of them
// happens or a read deadline passes; without, it answers at once (idle:
// neither has happened).
func (c *Conn) Peek(wait bool) (closed, data bool, err error) {
	var b [1]byte
	var n uintptr
	var errno syscall.Errno
	err = c.rc.Read(func(fd uintptr) bool {
		n, _, errno = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		return !wait || errno != syscall.EAGAIN
	})
	switch {
	case err != nil:
		return false, false, err
	case errno == syscall.EAGAIN:
		return false, false, nil
	case errno != 0:
		return true, false, nil
	case n == 0:
		return true, false, nil
	}
	return false, true, nil
}
