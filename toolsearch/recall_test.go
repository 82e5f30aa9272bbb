package toolsearch

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/capgate/capgate/tool"
)

// TestRecall measures the ranking on the corpus of real tools and the
// queries written for it, for the default configuration and for each
// variant that leaves one idea out, and fails when the default falls
// below the target (recall@5 ≥ 0.85). -v prints the figures;
// TOOLSEARCH_MISSES=1 prints the queries the default misses.
func TestRecall(t *testing.T) {
	tools, servers := loadCorpus(t)
	qs := loadQueries(t, tools)
	if len(tools) < 300 || len(servers) < 10 || len(qs) < 80 {
		t.Fatalf("corpus too small: %d tools from %d servers, %d queries (want ≥300, ≥10, ≥80)", len(tools), len(servers), len(qs))
	}
	t.Logf("corpus: %d tools from %d servers, %d queries", len(tools), len(servers), len(qs))
	variants := []struct {
		name string
		opts Options
	}{
		{"default: weights, synonyms, coordination", Default},
		{"equal field weights", with(Default, func(o *Options) { o.Name, o.Description, o.Params, o.Source = 1, 1, 1, 1 })},
		{"with Porter stemming", with(Default, func(o *Options) { o.Stem = true })},
		{"with prefix matching", with(Default, func(o *Options) { o.Prefix = true })},
		{"no synonyms", with(Default, func(o *Options) { o.NoSynonyms = true })},
		{"no coordination", with(Default, func(o *Options) { o.Coord = -1 })},
		{"plain BM25 (none of these)", Options{Name: 1, Description: 1, Params: 1, Source: 1, NoSynonyms: true, Coord: -1}},
	}
	var def scores
	for i, v := range variants {
		ix, err := Build(tools, v.opts)
		if err != nil {
			t.Fatal(err)
		}
		var misses func(query, []*tool.Descriptor)
		if i == 0 && os.Getenv("TOOLSEARCH_MISSES") != "" {
			misses = func(q query, got []*tool.Descriptor) {
				var names []string
				for _, d := range got[:min(5, len(got))] {
					names = append(names, d.Source+":"+d.Name)
				}
				fmt.Printf("MISS %q want %v got %s\n", q.Query, q.Tools, strings.Join(names, " "))
			}
		}
		s := evaluate(t, ix, qs, misses)
		_ = ix.Close()
		t.Logf("%-55s %s", v.name, s)
		if i == 0 {
			def = s
		}
	}
	if def.recall5 < 0.85 {
		t.Errorf("recall@5 is %.3f; the target is 0.85", def.recall5)
	}
}

func with(o Options, f func(*Options)) Options {
	f(&o)
	return o
}
