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
