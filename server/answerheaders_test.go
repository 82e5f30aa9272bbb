package server

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestFastCallAnswerHeaders: the fast call's answer has the headers
// mcp-go's has, its Content-Type application/json and a Date of now.
func TestFastCallAnswerHeaders(t *testing.T) {
	s, front := open(t)
	hs := httptest.NewServer(s.handler(false))
	t.Cleanup(hs.Close)
	tok := mint(t, token.Claims{Sub: "fast"})
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"fx__echo","arguments":{"message":"hi"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	post := func(base string) http.Header {
		req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
		req.Header = http.Header{"Authorization": {"Bearer " + tok}, "Content-Type": {"application/json"},
			"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2026-07-28"},
			"Mcp-Method": {"tools/call"}, "Mcp-Name": {"fx__echo"}}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"hi"`) {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return resp.Header
	}
	before := s.MCP.fastCalls.Load()
	fast := post(front)
	if s.MCP.fastCalls.Load() != before+1 {
		t.Fatal("the fast call did not take the call")
	}
	general := post(hs.URL)
	if k1, k2 := slices.Sorted(maps.Keys(fast)), slices.Sorted(maps.Keys(general)); !slices.Equal(k1, k2) {
		t.Errorf("fast call's headers %v, mcp-go's %v", k1, k2)
	}
	if ct := fast.Values("Content-Type"); len(ct) != 1 || ct[0] != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	d, err := http.ParseTime(fast.Get("Date"))
	if err != nil || time.Since(d).Abs() > 2*time.Second {
		t.Errorf("Date %q (%v): not now", fast.Get("Date"), err)
	}
}

// TestHTTPDate: the Date value is net/http's format of now, and follows
// the clock from one second to the next.
func TestHTTPDate(t *testing.T) {
	check := func() time.Time {
		t.Helper()
		before := time.Now().Truncate(time.Second)
		v := httpDate(time.Now())
		after := time.Now()
		d, err := http.ParseTime(v[0])
		if err != nil || len(v) != 1 || d.Before(before) || d.After(after) {
			t.Fatalf("httpDate() = %q (%v), want a time in [%v, %v]", v, err, before, after)
		}
		if v[0] != d.UTC().Format(http.TimeFormat) {
			t.Fatalf("httpDate() = %q, not in http.TimeFormat", v[0])
		}
		return d
	}
	first := check()
	if !testkit.Poll(5*time.Second, func() bool { return time.Now().Unix() > first.Unix() }) {
		t.Fatal("the clock did not move")
	}
	if next := check(); !next.After(first) {
		t.Fatalf("httpDate stayed at %v", first)
	}
}
