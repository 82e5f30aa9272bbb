package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/tool"
)

// httpPaths is a source on the fixture over streamable HTTP, its link,
// and the descriptors of its tools by name.
func httpPaths(tb testing.TB, args ...string) (*Source, *link, map[string]*tool.Descriptor) {
	tb.Helper()
	addr := testkit.FreeAddr(tb)
	testkit.ServeMCPFixture(tb, "-http", addr, args...)
	s, err := New(Options{Name: "fx", URL: "http://" + addr + "/mcp", Timeout: 10 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if err := s.Connect(ctx); err != nil {
		tb.Fatal(err)
	}
	ds, err := s.List(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	byName := map[string]*tool.Descriptor{}
	for _, d := range ds {
		byName[d.Name] = d
	}
	l, err := s.linkFor(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if !l.http {
		tb.Fatal("the link is not the posted HTTP one")
	}
	return s, l, byName
}

// The posted tools/call (callHTTP) reads every answer as mcp-go's client
// does: the same calls down both paths to the same upstream give the same
// result (content blocks, structured content and isError as JSON values)
// or the same error code.
func TestCallHTTPMatchesMCPGo(t *testing.T) {
	for _, fixture := range []struct {
		args  []string
		calls [][2]string // tool, input
	}{
		{nil, [][2]string{{"echo", `{"message":"hi"}`}, {"echo", `{"message":"caf\u00e9 \"q\" \n <b>"}`}, {"t_00", `{}`},
			{"echo", `{}`}, {"echo", `{"message":1}`}}},
		{[]string{"-hostile"}, [][2]string{{"shape", `{"json":"{\"n\":12345678901234567,\"a\":[1,{\"b\":null}]}"}`},
			{"shape", `{"json":"[1,2]"}`}, {"shape", `{"json":"not json"}`}, {"fail", `{}`}, {"pem", `{}`}, {"deep", `{"depth":3}`}}},
	} {
		s, l, tools := httpPaths(t, fixture.args...)
		for _, c := range fixture.calls {
			d := tools[c[0]]
			if d == nil {
				t.Fatalf("the fixture %v lists no %s", fixture.args, c[0])
			}
			call := tool.Call{Tool: d, Input: json.RawMessage(c[1])}
			ctx := context.Background()
			posted, perr := s.callHTTP(ctx, l, call, call.Input)
			general, gerr := s.callMCPGo(ctx, l, call, call.Input)
			if tool.ErrorCode(perr) != tool.ErrorCode(gerr) || (perr == nil) != (gerr == nil) {
				t.Errorf("%s %s: posted err %v, mcp-go err %v", c[0], c[1], perr, gerr)
				continue
			}
			if perr != nil {
				continue
			}
			if !sameResult(t, posted, general) {
				t.Errorf("%s %s:\nposted %s\nmcp-go %s", c[0], c[1], show(posted), show(general))
			}
		}
	}
}

func sameResult(t *testing.T, a, b *tool.Result) bool {
	t.Helper()
	if a.IsError != b.IsError || len(a.Content) != len(b.Content) || !sameJSON(t, a.Structured, b.Structured) {
		return false
	}
	for i := range a.Content {
		if !sameJSON(t, a.Content[i], b.Content[i]) {
			return false
		}
	}
	return true
}

func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	for _, x := range []struct {
		raw json.RawMessage
		v   *any
	}{{a, &va}, {b, &vb}} {
		d := json.NewDecoder(bytes.NewReader(x.raw))
		d.UseNumber()
		if err := d.Decode(x.v); err != nil {
			t.Fatalf("%v: %s", err, x.raw)
		}
	}
	return reflect.DeepEqual(va, vb)
}

func show(r *tool.Result) string { b, _ := json.Marshal(r); return string(b) }

// BenchmarkCallHTTP is a tools/call to a streamable-HTTP upstream, A/B:
// "posted" is callHTTP, "mcp-go" mcp-go's client on the same link. The
// fixture runs in its own process: cpu-ns/op is capgate's side alone.
func BenchmarkCallHTTP(b *testing.B) {
	s, l, tools := httpPaths(b)
	call := tool.Call{Tool: tools["echo"], Input: json.RawMessage(`{"message":"hi"}`)}
	for _, path := range []struct {
		name string
		call func(context.Context, *link, tool.Call, json.RawMessage) (*tool.Result, error)
	}{{"posted", s.callHTTP}, {"mcp-go", s.callMCPGo}} {
		b.Run(path.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			cpu := testkit.CPUTime()
			for b.Loop() {
				if _, err := path.call(ctx, l, call, call.Input); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
