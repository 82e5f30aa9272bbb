package toolsearch

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/tool"
)

// Indexes keeps the index of the newest catalog snapshot it was asked
// about, shared by every session and caller. A new snapshot (a refresh, an
// upstream's list_changed, a reload's new registry) gets a new index, and
// the old one is closed once its searches are done. Safe for concurrent
// use.
type Indexes struct {
	Options Options
	Logger  *slog.Logger

	mu   sync.Mutex // serialises builds
	kept []kept     // newest last
}

// kept is a snapshot's index. Two are kept: the calls that began before a
// refresh or reload finish on the old snapshot without rebuilding it.
type kept struct {
	snap *registry.Snapshot
	ix   *Index
}

const keep = 2

// For returns the index of snap, building it when snap is new.
func (x *Indexes) For(snap *registry.Snapshot) (*Index, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, k := range x.kept {
		if k.snap == snap {
			return k.ix, nil
		}
	}
	ix, err := Build(snap.Tools, x.Options)
	if err != nil {
		return nil, err
	}
	x.kept = append(x.kept, kept{snap, ix})
	if len(x.kept) > keep {
		old := x.kept[0].ix
		x.kept = x.kept[1:]
		// Waits for the old index's searches in flight, off this lock.
		go func() { _ = old.Close() }()
	}
	return ix, nil
}

// Prepare builds snap's index in the background, so that the first
// search after a catalog change does not wait for it.
func (x *Indexes) Prepare(snap *registry.Snapshot) {
	go func() {
		if _, err := x.For(snap); err != nil && x.Logger != nil {
			x.Logger.Error("tool search index not built", "err", err)
		}
	}()
}

// Search ranks snap's tools for query, keeping those allow accepts.
func (x *Indexes) Search(snap *registry.Snapshot, query string, limit int, allow func(*tool.Descriptor) bool) ([]*tool.Descriptor, error) {
	for {
		ix, err := x.For(snap)
		if err != nil {
			return nil, err
		}
		out, err := ix.Search(query, limit, allow)
		// Closed under us by a newer snapshot: snap's own index is built
		// again (rare: a search that raced a refresh).
		if errors.Is(err, ErrClosed) {
			continue
		}
		return out, err
	}
}

// Close frees the indexes.
func (x *Indexes) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	var errs []error
	for _, k := range x.kept {
		errs = append(errs, k.ix.Close())
	}
	x.kept = nil
	return errors.Join(errs...)
}
