// Package toolsearch ranks a catalog's tools for a query, so that an agent
// facing hundreds of tools lists a few and searches for the rest. One
// Index per catalog snapshot, built once and shared by every caller: the
// index holds no session or caller state, and each search is filtered by
// the caller's own predicate (what it could call) before it is cut.
//
// Ranking is SQLite FTS5's BM25 (modernc.org/sqlite, pure Go), over tool
// names split into words, titles, descriptions, parameter names and
// descriptions, and source names, with per-field weights, synonyms that
// the catalog itself contains and a coordination factor (Porter stemming
// and prefix terms are options; they measured worse). Measure
// changes with TestRecall (go test -run Recall -v ./toolsearch).
package toolsearch

import (
	"cmp"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite", with FTS5

	"github.com/capgate/capgate/tool"
)

// Options tune the ranking; the zero value is the measured default
// (Default).
type Options struct {
	// Weights of the fields in BM25: name, description, parameters,
	// source. Zero means the default's.
	Name, Description, Params, Source float64
	Stem                              bool // index Porter stems, not words as they are
	Prefix                            bool // match query words as prefixes too ("deploy" finds "deployment")
	NoSynonyms                        bool // do not widen a query with synonyms
	// SynonymWeight scales a match by a synonym against one by the word
	// itself; zero means the default's.
	SynonymWeight float64
	// Coord is the exponent of the share of the query's words a tool
	// matches, which multiplies its score; zero means the default's,
	// negative BM25's sum alone.
	Coord float64
}

// Default is the configuration TestRecall measured best on the corpus.
var Default = Options{Name: 4, Description: 1, Params: 0.25, Source: 2, SynonymWeight: 0.6, Coord: 1}

func (o Options) withDefaults() Options {
	if o.Name == 0 {
		o.Name = Default.Name
	}
	if o.Description == 0 {
		o.Description = Default.Description
	}
	if o.Params == 0 {
		o.Params = Default.Params
	}
	if o.Source == 0 {
		o.Source = Default.Source
	}
	if o.Coord == 0 {
		o.Coord = Default.Coord
	}
	if o.SynonymWeight == 0 {
		o.SynonymWeight = Default.SynonymWeight
	}
	return o
}

// Index ranks one fixed list of tools. It is safe for concurrent use.
type Index struct {
	tools []*tool.Descriptor // rowid-1 → tool
	opts  Options
	db    *sql.DB
	rank  *sql.Stmt // the ranking query
	// present holds the synonyms some tool uses: a synonym widens a query
	// only with a word of the catalog.
	present map[string]bool

	mu     sync.RWMutex // Close waits for searches in flight
	closed bool
}

// MaxLimit bounds how many tools one search returns.
const MaxLimit = 20

var dbSeq atomic.Int64

// Build indexes tools (kept as given, not copied: a snapshot's
// descriptors never change).
func Build(tools []*tool.Descriptor, opts Options) (*Index, error) {
	opts = opts.withDefaults()
	// A named in-memory database with a shared cache, so that the pool's
	// connections read one database concurrently. The pool never closes
	// its last connection (no idle limit), which would drop the data.
	name := "file:toolsearch-" + strconv.FormatInt(dbSeq.Add(1), 10) + "?mode=memory&cache=shared"
	db, err := sql.Open("sqlite", name)
	if err != nil {
		return nil, fmt.Errorf("tool search: opening the index: %w", err)
	}
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	ix := &Index{tools: tools, opts: opts, db: db}
	if err := ix.load(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return ix, nil
}

func (ix *Index) load() error {
	tokenize := "unicode61 remove_diacritics 2"
	if ix.opts.Stem {
		tokenize = "porter " + tokenize
	}
	stmts := []string{
		`PRAGMA read_uncommitted = true`,
		`CREATE VIRTUAL TABLE tools USING fts5(name, description, params, source, tokenize = '` + tokenize + `', prefix = '2 3 4')`,
	}
	for _, s := range stmts {
		if _, err := ix.db.Exec(s); err != nil {
			return fmt.Errorf("tool search: creating the index: %w", err)
		}
	}
	tx, err := ix.db.Begin()
	if err != nil {
		return fmt.Errorf("tool search: filling the index: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	ins, err := tx.Prepare(`INSERT INTO tools(rowid, name, description, params, source) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("tool search: filling the index: %w", err)
	}
	for i, d := range ix.tools {
		if _, err := ins.Exec(i+1, nameText(d), descriptionText(d), paramsText(d.InputSchema), sourceText(d)); err != nil {
			return fmt.Errorf("tool search: indexing %s: %w", d.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("tool search: filling the index: %w", err)
	}
	ix.present = map[string]bool{}
	if !ix.opts.NoSynonyms {
		probe, err := ix.db.Prepare(`SELECT 1 FROM tools WHERE tools MATCH ? LIMIT 1`)
		if err != nil {
			return fmt.Errorf("tool search: reading the vocabulary: %w", err)
		}
		defer probe.Close()
		for w := range synonymWords() {
			var one int
			switch err := probe.QueryRow(`"` + w + `"`).Scan(&one); {
			case err == nil:
				ix.present[w] = true
			case !errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("tool search: reading the vocabulary: %w", err)
			}
		}
	}
	o := ix.opts
	bm25 := fmt.Sprintf(`bm25(tools, %g, %g, %g, %g)`, o.Name, o.Description, o.Params, o.Source)
	if ix.rank, err = ix.db.Prepare(`SELECT rowid, ` + bm25 + ` FROM tools WHERE tools MATCH ? ORDER BY ` + bm25 + ` LIMIT ?`); err != nil {
		return fmt.Errorf("tool search: preparing the ranking: %w", err)
	}
	return nil
}

// Len is how many tools the index holds.
func (ix *Index) Len() int { return len(ix.tools) }

// ErrClosed is a search on an index that a newer catalog replaced.
var ErrClosed = errors.New("tool search: the index was closed")

// Search returns up to limit tools (1..MaxLimit) best matching query,
// best first, among those allow accepts (nil: all). A query with no word
// to search for finds nothing.
//
// A tool's score is BM25's: the sum over the query's words of each word's
// weight in the tool. A word counts as matched by itself (as a prefix) or,
// at SynonymWeight, by one of its synonyms, whichever scores higher, so
// that a tool using both a word and its synonym is not counted twice.
func (ix *Index) Search(query string, limit int, allow func(*tool.Descriptor) bool) ([]*tool.Descriptor, error) {
	limit = max(1, min(limit, MaxLimit))
	concepts := ix.concepts(query)
	if len(concepts) == 0 {
		return nil, nil
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if ix.closed {
		return nil, ErrClosed
	}
	// Each word's best tools first; all of them only when the caller's
	// filter left fewer than limit of those.
	ranked, cut, err := ix.rankAll(concepts, depth)
	if err != nil {
		return nil, err
	}
	out := ix.pick(ranked, limit, allow)
	if len(out) < limit && cut {
		if ranked, _, err = ix.rankAll(concepts, -1); err != nil {
			return nil, err
		}
		out = ix.pick(ranked, limit, allow)
	}
	return out, nil
}

// depth is how many of each word's best tools are scored first: a tool
// outside every word's first depth is very unlikely to make the answer.
const depth = 100

// rankAll scores the concepts' tools, each concept's best depth of them
// (-1: all), and returns them best first; cut says some concept had more.
func (ix *Index) rankAll(concepts []concept, depth int) (ranked []int, cut bool, err error) {
	total := make(map[int]float64)
	matched := make(map[int]int) // how many of the query's words a tool matched
	best := make(map[int]float64)
	for _, c := range concepts {
		clear(best)
		n, err := ix.score(c.word, 1, depth, best)
		if err != nil {
			return nil, false, err
		}
		cut = cut || (depth > 0 && n == depth)
		if c.synonyms != "" {
			n, err := ix.score(c.synonyms, ix.opts.SynonymWeight, depth, best)
			if err != nil {
				return nil, false, err
			}
			cut = cut || (depth > 0 && n == depth)
		}
		for id, s := range best {
			total[id] += s
			matched[id]++
		}
	}
	// Coordination: a tool that matches more of the query's words ranks
	// above one that matches a few of them strongly.
	if ix.opts.Coord > 0 {
		for id := range total {
			total[id] *= math.Pow(float64(matched[id])/float64(len(concepts)), ix.opts.Coord)
		}
	}
	ranked = make([]int, 0, len(total))
	for id := range total {
		ranked = append(ranked, id)
	}
	// Best first; ties in catalog order, so that every replica answers alike.
	slices.SortFunc(ranked, func(a, b int) int { return cmp.Or(cmp.Compare(total[b], total[a]), cmp.Compare(a, b)) })
	return ranked, cut, nil
}

// pick is the first limit of ranked that allow accepts.
func (ix *Index) pick(ranked []int, limit int, allow func(*tool.Descriptor) bool) []*tool.Descriptor {
	var out []*tool.Descriptor
	for _, id := range ranked {
		d := ix.tools[id-1]
		if allow != nil && !allow(d) {
			continue
		}
		if out = append(out, d); len(out) == limit {
			break
		}
	}
	return out
}

// score runs one FTS5 query for the best depth tools (-1: all) and
// keeps, per tool, the higher of best's
// score and this one's times weight. FTS5's bm25 is negative, lower
// better: its score is its negation.
func (ix *Index) score(match string, weight float64, depth int, best map[int]float64) (n int, err error) {
	rows, err := ix.rank.Query(match, depth)
	if err != nil {
		return 0, fmt.Errorf("tool search: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int
		var bm float64
		if err := rows.Scan(&id, &bm); err != nil {
			return n, fmt.Errorf("tool search: %w", err)
		}
		n++
		if s := -bm * weight; s > best[id] {
			best[id] = s
		}
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("tool search: %w", err)
	}
	return n, nil
}

// Close frees the index, once the searches in flight are done.
func (ix *Index) Close() error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.closed {
		return nil
	}
	ix.closed = true
	_ = ix.rank.Close()
	return ix.db.Close()
}

// concept is one word of a query as FTS5 queries: the word itself, and
// its synonyms that the catalog uses, OR'd ("" for none).
type concept struct{ word, synonyms string }

// concepts are a query's words that are not stop words, each a prefix
// with Prefix unless short ("go*" would match "google").
func (ix *Index) concepts(query string) []concept {
	var out []concept
	seen := map[string]bool{}
	for _, w := range queryWords(query) {
		if seen[w] {
			continue
		}
		seen[w] = true
		c := concept{word: `"` + w + `"`}
		if ix.opts.Prefix && len(w) >= 4 {
			c.word += "*"
		}
		if !ix.opts.NoSynonyms {
			var syn []string
			for _, s := range synonyms[w] {
				if ix.present[s] {
					syn = append(syn, `"`+s+`"`)
				}
			}
			c.synonyms = strings.Join(syn, " OR ")
		}
		out = append(out, c)
	}
	return out
}
