package httpadmit

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// echoServer answers with what ReadBody read, or with ReadBody's refusal.
func echoServer(t testing.TB, limit int64) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if body, ok := ReadBody(w, r, limit); ok {
			w.Write(body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// post sends body with its length announced, or chunked (length unknown).
func post(t testing.TB, url string, body []byte, known bool) (int, string) {
	var rd io.Reader = bytes.NewReader(body)
	if !known {
		rd = io.MultiReader(rd) // no Len: the client sends it chunked
	}
	req, err := http.NewRequest("POST", url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if known && req.ContentLength != int64(len(body)) || !known && req.ContentLength > 0 {
		t.Fatalf("known %v but ContentLength %d", known, req.ContentLength)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReadBodyKnownLengthIsGeneral: a body of announced length (read into
// a buffer of that size) gets the same answer as the same body chunked
// (the general path): the same bytes, or the same refusal.
func TestReadBodyKnownLengthIsGeneral(t *testing.T) {
	const limit = 100 << 10
	url := echoServer(t, limit)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 511, 512, 513, knownMax - 1, knownMax, knownMax + 1, limit - 1, limit, limit + 1, 2 * limit}
	for range 40 {
		sizes = append(sizes, rng.IntN(knownMax+2))
	}
	for _, n := range sizes {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(rng.IntN(256))
		}
		ks, kb := post(t, url, body, true)
		cs, cb := post(t, url, body, false)
		if ks != cs || kb != cb {
			t.Fatalf("%d bytes: announced %d (%d bytes back), chunked %d (%d bytes back)", n, ks, len(kb), cs, len(cb))
		}
		want := http.StatusOK
		if n > limit {
			want = http.StatusRequestEntityTooLarge
		}
		if ks != want || (ks == http.StatusOK && kb != string(body)) {
			t.Fatalf("%d bytes: %d, %d bytes back; want %d and the body", n, ks, len(kb), want)
		}
	}
}

// TestReadBodyCutShort: a body that ends before its announced length is a
// 400, as a chunked body that ends before its last chunk is.
func TestReadBodyCutShort(t *testing.T) {
	url := echoServer(t, 1<<20)
	addr := strings.TrimPrefix(url, "http://")
	for _, head := range []string{
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n0123456789",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, head)
		c.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "could not be read") {
			t.Errorf("%q: %d %s; want 400 naming the unread body", head, resp.StatusCode, b)
		}
	}
}

// BenchmarkReadBody is ReadBody on a call-sized body, A/B: "known" has its
// length announced (the buffer of that size), "chunked" the general path.
func BenchmarkReadBody(b *testing.B) {
	url := echoServer(b, 1<<20)
	body := bytes.Repeat([]byte("x"), 300)
	for _, known := range []bool{true, false} {
		name := map[bool]string{true: "known", false: "chunked"}[known]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s, _ := post(b, url, body, known); s != http.StatusOK {
					b.Fatal(s)
				}
			}
		})
	}
}
