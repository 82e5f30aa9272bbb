package logbuf

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// both writes one record through TextHandler and through slog's own text
// handler, each to a buffer of its own.
func both(t *testing.T, r slog.Record) (fast, general string) {
	t.Helper()
	var fb, gb bytes.Buffer
	fw, gw := New(&fb, 0), New(&gb, 0)
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	if err := fw.TextHandler(opts).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if err := slog.NewTextHandler(gw, opts).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	fw.Flush()
	gw.Flush()
	return fb.String(), gb.String()
}

// record is a "call" line as the router logs it, with the given words
// and numbers.
func record(tm time.Time, msg, key, s1, s2 string, f float64, i int64, ok bool) slog.Record {
	r := slog.NewRecord(tm, slog.LevelInfo, msg, 0)
	r.AddAttrs(slog.String("sub", s1), slog.String(key, s2), slog.String("code", ""),
		slog.Float64("duration_ms", f), slog.Int64("n", i), slog.Bool("ok", ok))
	return r
}

var textSeeds = []struct {
	msg, key, s1, s2 string
	f                float64
	i                int64
}{
	{"call", "tool", "bench", "echo", 0.412, 1},
	{"call", "tool", "", "a b", 1e21, -7},
	{"x=y", "k=v", `q"uote`, `back\slash`, 1.5e-7, math.MaxInt64},
	{"tab\tnew\nline", "é", "caf\u00e9", "\u00a0nbsp", math.Inf(1), math.MinInt64},
	{"\x7f", "\x00", "\xff\xfe", "\u2028", math.NaN(), 0},
	{"ok", "key with space", "日本", "\U0001F600", -0.0, 42},
}

// TextHandler writes every record byte for byte as slog's text handler
// does, in both of its ways (its own, or slog's for what it does not take).
func TestTextHandlerMatchesSlog(t *testing.T) {
	times := []time.Time{time.Date(2026, 11, 27, 11, 54, 22, 123456789, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), {}, time.Now()}
	for _, s := range textSeeds {
		for _, tm := range times {
			for _, ok := range []bool{true, false} {
				fast, general := both(t, record(tm, s.msg, s.key, s.s1, s.s2, s.f, s.i, ok))
				if fast != general {
					t.Errorf("fast    %q\ngeneral %q", fast, general)
				}
			}
		}
	}
	// What it leaves to slog: a group, a time, an empty key, a Duration.
	for _, a := range []slog.Attr{slog.Group("g", slog.String("a", "b")), slog.Time("at", times[0]),
		slog.String("", "anon"), slog.Duration("d", time.Second), slog.Any("any", []int{1})} {
		r := slog.NewRecord(times[0], slog.LevelWarn, "m", 0)
		r.AddAttrs(slog.String("sub", "s"), a)
		if fast, general := both(t, r); fast != general {
			t.Errorf("with %v:\nfast    %q\ngeneral %q", a, fast, general)
		}
	}
	// Loggers made from it are slog's, and their lines come whole.
	var b bytes.Buffer
	w := New(&b, 0)
	l := slog.New(w.TextHandler(nil)).With("replica", "r1")
	l.Info("call", "sub", "s")
	w.Flush()
	if !strings.HasSuffix(b.String(), "level=INFO msg=call replica=r1 sub=s\n") {
		t.Errorf("With: %q", b.String())
	}
}

func FuzzTextHandler(f *testing.F) {
	for _, s := range textSeeds {
		f.Add(s.msg, s.key, s.s1, s.s2, s.f, s.i, int64(1795000000123456789))
	}
	f.Fuzz(func(t *testing.T, msg, key, s1, s2 string, fl float64, i, ns int64) {
		tm := time.Unix(0, ns).UTC()
		if fast, general := both(t, record(tm, msg, key, s1, s2, fl, i, ns%2 == 0)); fast != general {
			t.Errorf("fast    %q\ngeneral %q", fast, general)
		}
	})
}

// BenchmarkTextHandler is serve's "call" line, A/B: "fast" is
// TextHandler, "slog" slog's text handler, each to a Writer over
// io.Discard.
func BenchmarkTextHandler(b *testing.B) {
	w := New(io.Discard, 0)
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	for _, h := range []struct {
		name string
		h    slog.Handler
	}{{"fast", w.TextHandler(opts)}, {"slog", slog.NewTextHandler(w, opts)}} {
		b.Run(h.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			cpu := testkit.CPUTime()
			for b.Loop() {
				r := slog.NewRecord(time.Now(), slog.LevelInfo, "call", 0)
				r.AddAttrs(slog.String("sub", "bench"), slog.String("tool", "echo"), slog.String("decision", "allow"),
					slog.String("code", ""), slog.String("gate", ""), slog.Float64("duration_ms", 0.412),
					slog.String("request_id", "cap_0123456789abcdef01234567"))
				if err := h.h.Handle(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testkit.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
