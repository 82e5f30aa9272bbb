package rawconn

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
)

// pair returns a raw Conn accepted through Listener and the plain TCP
// connection dialed to it.
func pair(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	c, err := Listener{Listener: ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, ok := c.(*Conn)
	if !ok {
		t.Fatalf("Listener.Accept returned %T, want *rawconn.Conn", c)
	}
	return rc, peer.(*net.TCPConn)
}

// waitPeek polls Peek(false) until want reports true, as loopback
// delivery is quick but not synchronous with the peer's call.
func waitPeek(t *testing.T, c *Conn, want func(closed, data bool) bool) (closed, data bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		closed, data, err := c.Peek(false)
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		if want(closed, data) {
			return closed, data
		}
		if time.Now().After(deadline) {
			t.Fatalf("Peek never matched: closed=%v data=%v", closed, data)
		}
		time.Sleep(time.Millisecond)
	}
}

// The raw syscalls must move every byte, in order, across partial writes
// and EAGAIN waits in both directions at once.
func TestLargePayloadRoundTripBothDirections(t *testing.T) {
	c, peer := pair(t)
	// Small socket buffers force many partial writes and EAGAIN waits.
	peer.SetReadBuffer(64 << 10)
	peer.SetWriteBuffer(64 << 10)
	// Bytes lost or miscounted must fail the test, not hang it.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	peer.SetDeadline(time.Now().Add(30 * time.Second))
	const size = 8 << 20
	out := make([]byte, size)
	in := make([]byte, size)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(out)
	r.Read(in)

	errc := make(chan error, 3)
	got := make(chan []byte, 1)
	go func() { // raw write → peer read
		n, err := c.Write(out)
		if err == nil && n != size {
			err = io.ErrShortWrite
		}
		errc <- err
	}()
	go func() {
		b, err := io.ReadAll(io.LimitReader(peer, size))
		got <- b
		errc <- err
	}()
	go func() { // peer write → raw read
		_, err := peer.Write(in)
		errc <- err
	}()
	back := make([]byte, 0, size)
	buf := make([]byte, 3000) // odd size: reads end mid-segment
	for len(back) < size {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("raw read after %d bytes: %v", len(back), err)
		}
		back = append(back, buf[:n]...)
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(<-got, out) {
		t.Error("bytes written raw arrived changed")
	}
	if !bytes.Equal(back, in) {
		t.Error("bytes read raw differ from those sent")
	}
}

// A zero-length read must not be mistaken for EOF.
func TestReadEmptyBufferIsNotEOF(t *testing.T) {
	c, _ := pair(t)
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
}

// Callers (bufio, net/http) rely on exactly io.EOF after the peer closes.
func TestReadEOFAfterPeerClose(t *testing.T) {
	c, peer := pair(t)
	peer.Write([]byte("bye"))
	peer.Close()
	b, err := io.ReadAll(c) // ReadAll stops only at io.EOF
	if err != nil || string(b) != "bye" {
		t.Fatalf("ReadAll = %q, %v; want \"bye\", nil", b, err)
	}
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("Read after EOF = %d, %v; want 0, io.EOF", n, err)
	}
}

// Deadlines still go through the netpoller and surface as net/http expects.
func TestReadDeadlineIsTimeout(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	start := time.Now()
	_, err := c.Read(make([]byte, 8))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v; want os.ErrDeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v; want a net.Error with Timeout()", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("read returned after %v", d)
	}
}

// Servers tell a closed listener or conn from a real failure by net.ErrClosed.
func TestReadWriteOnClosedConnAreErrClosed(t *testing.T) {
	c, _ := pair(t)
	c.Close()
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v; want net.ErrClosed", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v; want net.ErrClosed", err)
	}
}

// A raw write to a reset connection must return an error (not SIGPIPE or hang).
func TestWriteToResetPeerFails(t *testing.T) {
	c, peer := pair(t)
	peer.SetLinger(0) // Close sends RST
	peer.Close()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	chunk := make([]byte, 64<<10)
	for i := 0; ; i++ {
		_, err := c.Write(chunk)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("write never failed, timed out instead: %v", err)
			}
			return
		}
		if i > 1000 {
			t.Fatal("writes to a reset peer kept succeeding")
		}
	}
}

// CloseWrite lets the peer see EOF while this side can still read.
func TestCloseWriteHalfCloses(t *testing.T) {
	c, peer := pair(t)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peer.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("peer Read = %d, %v; want EOF", n, err)
	}
	peer.Write([]byte("still"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "still" {
		t.Fatalf("read after CloseWrite = %q, %v", buf, err)
	}
}

// An idle connection must read as neither closed nor carrying data.
func TestPeekIdle(t *testing.T) {
	c, _ := pair(t)
	closed, data, err := c.Peek(false)
	if closed || data || err != nil {
		t.Fatalf("Peek(false) = %v, %v, %v; want false, false, nil", closed, data, err)
	}
}

// Peek must see sent bytes without consuming them.
func TestPeekDataLeavesItReadable(t *testing.T) {
	c, peer := pair(t)
	peer.Write([]byte("hello"))
	if closed, _ := waitPeek(t, c, func(cl, d bool) bool { return cl || d }); closed {
		t.Fatal("Peek said closed; want data")
	}
	if _, data, _ := c.Peek(false); !data {
		t.Fatal("second Peek lost the data")
	}
	buf := make([]byte, 5)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read after Peek = %q, %v", buf, err)
	}
}

// A pool must learn that the server closed an idle connection.
func TestPeekAfterPeerClose(t *testing.T) {
	c, peer := pair(t)
	peer.Close()
	if _, data := waitPeek(t, c, func(cl, d bool) bool { return cl || d }); data {
		t.Fatal("Peek said data; want closed")
	}
}

// Peek(true) is how a server watches a long request's client go away.
func TestPeekWaitBlocksUntilPeerCloses(t *testing.T) {
	c, peer := pair(t)
	type result struct {
		closed, data bool
		err          error
	}
	res := make(chan result, 1)
	go func() {
		closed, data, err := c.Peek(true)
		res <- result{closed, data, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Peek(true) returned %+v on an idle conn", r)
	case <-time.After(50 * time.Millisecond):
	}
	peer.Close()
	select {
	case r := <-res:
		if !r.closed || r.data || r.err != nil {
			t.Fatalf("Peek(true) = %+v; want closed", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Peek(true) did not return after the peer closed")
	}
}

// Peek(true) must also wake on data, so a pipelined request ends the watch.
func TestPeekWaitReturnsOnData(t *testing.T) {
	c, peer := pair(t)
	res := make(chan bool, 1)
	go func() {
		_, data, err := c.Peek(true)
		res <- data && err == nil
	}()
	peer.Write([]byte("x"))
	select {
	case ok := <-res:
		if !ok {
			t.Fatal("Peek(true) did not report data")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Peek(true) did not return on data")
	}
}

// A watcher must be stoppable: a past read deadline from another goroutine ends Peek(true).
func TestPeekWaitEndsOnPastDeadline(t *testing.T) {
	c, _ := pair(t)
	res := make(chan error, 1)
	go func() {
		_, _, err := c.Peek(true)
		res <- err
	}()
	select {
	case err := <-res:
		t.Fatalf("Peek(true) returned early: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	c.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-res:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Peek(true) err = %v; want os.ErrDeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Peek(true) ignored a past deadline")
	}
}

// Conns without a socket must pass through untouched.
func TestWrapLeavesPipeUnchanged(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(pipe) = %T, want the pipe itself", got)
	}
}

// readAllFrom reads from peer until EOF in the background; the result
// comes on the returned channel.
func readAllFrom(peer net.Conn) <-chan []byte {
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		got <- b
	}()
	return got
}

// WriteBeforeRead's request goes out whole, once, and the same Read
// returns the answer; the Reads after it are plain reads.
func TestWriteBeforeReadExchange(t *testing.T) {
	c, peer := pair(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	peer.SetDeadline(time.Now().Add(10 * time.Second))
	request := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	errc := make(chan error, 1)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(request))
		if _, err := io.ReadFull(peer, b); err != nil {
			errc <- err
			return
		}
		got <- b
		// The answer in two parts, the second after a pause, so that the
		// second Read must wait for it.
		peer.Write([]byte("answer-1;"))
		time.Sleep(20 * time.Millisecond)
		_, err := peer.Write([]byte("answer-2"))
		errc <- err
	}()
	c.WriteBeforeRead(request)
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("Read after WriteBeforeRead: %v", err)
	}
	answer := string(buf[:n])
	for len(answer) < len("answer-1;answer-2") {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("Read after %q: %v", answer, err)
		}
		answer += string(buf[:n])
	}
	if answer != "answer-1;answer-2" {
		t.Fatalf("answer %q", answer)
	}
	if err := <-errc; err != nil {
		t.Fatalf("peer: %v", err)
	}
	if b := <-got; !bytes.Equal(b, request) {
		t.Fatalf("peer got %q, want %q", b, request)
	}
	// Nothing more was sent: the peer sees EOF right after the request.
	c.CloseWrite()
	if rest := <-readAllFrom(peer); len(rest) != 0 {
		t.Fatalf("peer got %q more after the request", rest)
	}
}

// A connection the peer had closed gets nothing, and says so with
// ErrNotSent, so that the request may go on another.
func TestWriteBeforeReadPeerClosedIsNotSent(t *testing.T) {
	c, peer := pair(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	peer.SetDeadline(time.Now().Add(10 * time.Second))
	peer.CloseWrite() // FIN, and the peer can still see what arrives
	waitPeek(t, c, func(closed, _ bool) bool { return closed })
	c.WriteBeforeRead([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if n, err := c.Read(make([]byte, 64)); n != 0 || !errors.Is(err, ErrNotSent) {
		t.Fatalf("Read = %d, %v; want 0, ErrNotSent", n, err)
	}
	c.CloseWrite()
	if b := <-readAllFrom(peer); len(b) != 0 {
		t.Fatalf("peer got %q; want nothing", b)
	}
}

// Bytes the peer sent unasked make the request not sent, and stay
// readable.
func TestWriteBeforeReadPeerSpokeFirstIsNotSent(t *testing.T) {
	c, peer := pair(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	peer.SetDeadline(time.Now().Add(10 * time.Second))
	peer.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
	waitPeek(t, c, func(_, data bool) bool { return data })
	c.WriteBeforeRead([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if n, err := c.Read(make([]byte, 64)); n != 0 || !errors.Is(err, ErrNotSent) {
		t.Fatalf("Read = %d, %v; want 0, ErrNotSent", n, err)
	}
	buf := make([]byte, len("HTTP/1.1 408 Request Timeout\r\n\r\n"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "HTTP/1.1 408 Request Timeout\r\n\r\n" {
		t.Fatalf("plain Read after ErrNotSent = %q, %v; want the unasked bytes", buf, err)
	}
	c.CloseWrite()
	if b := <-readAllFrom(peer); len(b) != 0 {
		t.Fatalf("peer got %q; want nothing", b)
	}
}

// A request larger than the socket's send buffer fills it (EAGAIN): the
// rest goes out with a plain Write, every byte in order, and the answer is
// read.
func TestWriteBeforeReadLargerThanSendBuffer(t *testing.T) {
	c, peer := pair(t)
	c.Conn.(*net.TCPConn).SetWriteBuffer(32 << 10)
	peer.SetReadBuffer(32 << 10)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	peer.SetDeadline(time.Now().Add(30 * time.Second))
	const size = 4 << 20
	request := make([]byte, size)
	rand.NewChaCha8([32]byte{2}).Read(request)
	errc := make(chan error, 1)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, size)
		// Slow at first, so that the writer surely meets a full buffer.
		time.Sleep(20 * time.Millisecond)
		if _, err := io.ReadFull(peer, b); err != nil {
			errc <- err
			return
		}
		got <- b
		_, err := peer.Write([]byte("done"))
		errc <- err
	}()
	c.WriteBeforeRead(request)
	buf := make([]byte, 16)
	n, err := io.ReadAtLeast(c, buf, 4)
	if err != nil || string(buf[:n]) != "done" {
		t.Fatalf("answer %q, %v; want \"done\"", buf[:n], err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("peer: %v", err)
	}
	if !bytes.Equal(<-got, request) {
		t.Fatal("the request arrived changed")
	}
	c.CloseWrite()
	if rest := <-readAllFrom(peer); len(rest) != 0 {
		t.Fatalf("peer got %d bytes more after the request", len(rest))
	}
}

// A read deadline that has passed ends the Read before anything is sent.
func TestWriteBeforeReadPastDeadlineSendsNothing(t *testing.T) {
	c, peer := pair(t)
	peer.SetDeadline(time.Now().Add(10 * time.Second))
	c.SetReadDeadline(time.Unix(1, 0))
	c.WriteBeforeRead([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if _, err := c.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %v; want os.ErrDeadlineExceeded", err)
	}
	c.CloseWrite()
	if b := <-readAllFrom(peer); len(b) != 0 {
		t.Fatalf("peer got %q; want nothing", b)
	}
}
