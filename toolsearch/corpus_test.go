package toolsearch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// corpusServer is one file of testdata/corpus: the tools a public MCP
// server listed (see testdata/harvest).
type corpusServer struct {
	Server  string `json:"server"`
	Package string `json:"package"`
	How     string `json:"how"`
	Tools   []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"inputSchema"`
	} `json:"tools"`
}

// loadCorpus reads every server of testdata/corpus as an MCP source of
// that name, exposed as capgate would by default (server__tool).
func loadCorpus(t testing.TB) (tools []*tool.Descriptor, servers []corpusServer) {
	t.Helper()
	files, err := filepath.Glob("testdata/corpus/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus in testdata/corpus: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s corpusServer
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		servers = append(servers, s)
		for _, ct := range s.Tools {
			tools = append(tools, corpusTool(s.Server, ct.Name, ct.Description, ct.InputSchema))
		}
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].ID < tools[j].ID })
	return tools, servers
}

func corpusTool(source, name, desc string, schema json.RawMessage) *tool.Descriptor {
	return &tool.Descriptor{ID: tool.ID(tool.KindMCP, source, name), Kind: tool.KindMCP, Source: source, Name: name,
		ExposedName: registry.ExposedName(source, name), Description: desc, InputSchema: schema,
		Risk: risk.Assessment{Level: risk.Low}, Available: true}
}

// query is one line of testdata/queries.json: what a user asks, and the
// tools (server:name) any of which serves it.
type query struct {
	Query string   `json:"query"`
	Tools []string `json:"tools"`
}

func loadQueries(t testing.TB, tools []*tool.Descriptor) []query {
	t.Helper()
	b, err := os.ReadFile("testdata/queries.json")
	if err != nil {
		t.Fatal(err)
	}
	var qs []query
	if err := json.Unmarshal(b, &qs); err != nil {
		t.Fatalf("testdata/queries.json: %v", err)
	}
	known := map[string]bool{}
	for _, d := range tools {
		known[d.Source+":"+d.Name] = true
	}
	for _, q := range qs {
		if len(q.Tools) == 0 {
			t.Fatalf("query %q names no tool", q.Query)
		}
		for _, id := range q.Tools {
			if !known[id] {
				t.Fatalf("query %q names %s, which is not in the corpus", q.Query, id)
			}
		}
	}
	return qs
}

// scores are what TestRecall reports for one configuration.
type scores struct{ recall1, recall5, mrr float64 }

func (s scores) String() string {
	return fmt.Sprintf("recall@1 %.3f  recall@5 %.3f  MRR %.3f", s.recall1, s.recall5, s.mrr)
}

// evaluate ranks every query: a query is answered at rank r when the r-th
// tool returned is one of those that serve it.
func evaluate(t testing.TB, ix *Index, qs []query, misses func(q query, got []*tool.Descriptor)) scores {
	t.Helper()
	var s scores
	for _, q := range qs {
		got, err := ix.Search(q.Query, MaxLimit, nil)
		if err != nil {
			t.Fatalf("%q: %v", q.Query, err)
		}
		rank := 0
		for i, d := range got {
			for _, want := range q.Tools {
				if d.Source+":"+d.Name == want && rank == 0 {
					rank = i + 1
				}
			}
		}
		if rank == 1 {
			s.recall1++
		}
		if rank >= 1 && rank <= 5 {
			s.recall5++
		} else if misses != nil {
			misses(q, got)
		}
		if rank > 0 {
			s.mrr += 1 / float64(rank)
		}
	}
	n := float64(len(qs))
	return scores{s.recall1 / n, s.recall5 / n, s.mrr / n}
}
