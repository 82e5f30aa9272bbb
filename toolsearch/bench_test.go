package toolsearch

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/tool"
)

// scaled is the corpus copied under new source names ("github-03", ...)
// until it holds n tools: a catalog of n tools with the corpus's words.
func scaled(tb testing.TB, n int) []*tool.Descriptor {
	tb.Helper()
	base, _ := loadCorpus(tb)
	out := make([]*tool.Descriptor, 0, n)
	for k := 0; len(out) < n; k++ {
		for _, d := range base {
			if len(out) == n {
				break
			}
			src := d.Source
			if k > 0 {
				src = fmt.Sprintf("%s-%02d", d.Source, k)
			}
			out = append(out, corpusTool(src, d.Name, d.Description, d.InputSchema))
		}
	}
	return out
}

// BenchmarkSearch5000 is one search_tools ranking among 5,000 tools, the
// corpus's queries in turn, limit 5. It reports the p50 and p95 latency
// of one search (p50-ns, p95-ns).
func BenchmarkSearch5000(b *testing.B) {
	tools := scaled(b, 5000)
	qs := loadQueries(b, tools)
	ix, err := Build(tools, Default)
	if err != nil {
		b.Fatal(err)
	}
	defer ix.Close()
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if _, err := ix.Search(qs[i%len(qs)].Query, 5, nil); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(took[len(took)*95/100].Nanoseconds()), "p95-ns")
}

// BenchmarkBuild5000 builds the index of 5,000 tools. It reports the
// memory one index holds: the Go heap it keeps (heap-bytes) and the
// process's resident set it adds (rss-bytes), which counts SQLite's own
// allocations too.
func BenchmarkBuild5000(b *testing.B) {
	tools := scaled(b, 5000)
	heap0, rss0 := memory()
	kept, err := Build(tools, Default)
	if err != nil {
		b.Fatal(err)
	}
	heap1, rss1 := memory()
	defer kept.Close()
	for b.Loop() {
		ix, err := Build(tools, Default)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		ix.Close()
		b.StartTimer()
	}
	// After the loop: resetting the timer drops reported metrics.
	b.ReportMetric(float64(heap1-heap0), "heap-bytes")
	b.ReportMetric(float64(rss1-rss0), "rss-bytes")
}

// memory is the Go heap in use after a collection, and the resident set
// (Linux; 0 elsewhere).
func memory() (heap, rss int64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			rss = pages * int64(os.Getpagesize())
		}
	}
	return int64(m.HeapInuse), rss
}
