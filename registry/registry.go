// Package registry merges the tool sources into one catalog: snapshots
// rebuilt on refresh and swapped atomically, exposed names, operator
// overrides, filters and search, and definition pins.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capgate/capgate/internal/paramheader"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// Override is an operator's word on a tool; it is applied last and wins.
type Override struct {
	Level       risk.Level
	Effects     []risk.SideEffect // nil: not overridden
	Description string
	Hidden      bool
	Name        string // exposed name
}

// Options configure a Registry.
type Options struct {
	// Prefixes maps a source ("<kind>:<source>") to the prefix of its
	// exposed names; absent means the source id, "" means none.
	Prefixes map[string]string
	// Defaults are per-source overrides ("<kind>:<source>"), beneath the
	// per-tool ones in Overrides (by tool id).
	Defaults  map[string]Override
	Overrides map[string]Override
	// Lock pins definitions; RequireLock also quarantines tools it lacks.
	Lock        *Lock
	RequireLock bool
	TTL         time.Duration // default 60s
	Logger      *slog.Logger
}

// Registry is the merged catalog. It is safe for concurrent use.
type Registry struct {
	sources []tool.Source
	byKey   map[string]tool.Source // SourceKey → source
	opts    Options
	snap    atomic.Pointer[Snapshot]

	failed atomic.Int64 // sources whose last listing failed
	// failures are those sources' errors, by source key (under mu).
	failures map[string]error

	lock     atomic.Pointer[Lock] // the pins (opts.Lock, then SetLock's)
	mu       sync.Mutex           // serialises refreshes
	lastGood map[string][]*tool.Descriptor
	// noted holds, by tool id, the definition hash whose outdated pin
	// was logged (under mu), so each is logged once.
	noted    map[string]string
	changed  chan struct{}
	watchers []func(*Snapshot)
	inflight atomic.Int64 // calls held or in Call now; Drain waits for none
}

// New builds the first snapshot from every source, listing them
// concurrently. A source that fails to list is kept, with no tools, and
// retried at the next refresh; a name clash is an error.
func New(ctx context.Context, sources []tool.Source, opts Options) (*Registry, error) {
	if opts.TTL <= 0 {
		opts.TTL = 60 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Registry{sources: sources, byKey: map[string]tool.Source{}, opts: opts,
		lastGood: map[string][]*tool.Descriptor{}, noted: map[string]string{}, changed: make(chan struct{}, 1)}
	r.lock.Store(opts.Lock)
	for _, s := range sources {
		key := SourceKey(s)
		if _, dup := r.byKey[key]; dup {
			return nil, fmt.Errorf("two sources are both %s", key)
		}
		r.byKey[key] = s
		if n, ok := s.(tool.Notifier); ok {
			n.OnChange(r.notify)
		}
	}
	if err := r.Refresh(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// SourceKey names a source as "<kind>:<source>".
func SourceKey(s tool.Source) string { return string(s.Kind()) + ":" + s.ID() }

func (r *Registry) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Snapshot returns the current catalog. It never changes; a refresh makes
// a new one.
func (r *Registry) Snapshot() *Snapshot { return r.snap.Load() }

// SourcesUp says how many sources listed their tools at the last refresh,
// and how many there are.
func (r *Registry) SourcesUp() (available, total int) {
	return len(r.sources) - int(r.failed.Load()), len(r.sources)
}

// Failures are the sources whose last listing failed, by source key
// ("mcp:files"), with their errors.
func (r *Registry) Failures() map[string]error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.failures)
}

// Source returns the source a tool comes from.
func (r *Registry) Source(d *tool.Descriptor) (tool.Source, bool) {
	s, ok := r.byKey[string(d.Kind)+":"+d.Source]
	return s, ok
}

// Refresh lists every source again and swaps in the new snapshot. A source
// that fails keeps its last good list, marked unavailable. It fails only
// when the new catalog is inconsistent (a name clash), and then the old
// snapshot stays.
func (r *Registry) Refresh(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	type listed struct {
		tools []*tool.Descriptor
		err   error
	}
	results := make([]listed, len(r.sources))
	var wg sync.WaitGroup
	for i, s := range r.sources {
		wg.Go(func() {
			ts, err := s.List(ctx)
			results[i] = listed{ts, err}
		})
	}
	wg.Wait()
	var all []*tool.Descriptor
	failed := 0
	r.failures = map[string]error{}
	for i, s := range r.sources {
		key := SourceKey(s)
		res := results[i]
		if res.err != nil {
			failed++
			r.failures[key] = res.err
			r.opts.Logger.Warn("tool source failed to list; keeping its last good tools as unavailable",
				"source", key, "err", res.err)
			for _, d := range r.lastGood[key] {
				c := d.Clone()
				c.Available = false
				all = append(all, c)
			}
			continue
		}
		r.lastGood[key] = res.tools
		all = append(all, res.tools...)
	}
	r.failed.Store(int64(failed))
	snap, err := r.build(all)
	if err != nil {
		return err
	}
	snap.down = maps.Clone(r.failures)
	for key := range snap.down {
		if p := r.Prefix(key); p != "" {
			if snap.downNames == nil {
				snap.downNames = map[string]string{}
			}
			snap.downNames[sanitize(p)+"__"] = key
		}
	}
	r.snap.Store(snap)
	for _, w := range r.watchers {
		w(snap)
	}
	return nil
}

// Watch calls f with every new snapshot, after it is in place. f runs
// while refreshes are held back, so it must not refresh.
func (r *Registry) Watch(f func(*Snapshot)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers = append(r.watchers, f)
}

// build turns listed tools into a snapshot: hashes, names, overrides,
// pins, hidden tools dropped, clashes refused.
func (r *Registry) build(listed []*tool.Descriptor) (*Snapshot, error) {
	s := &Snapshot{byID: map[string]*tool.Descriptor{}, byName: map[string]*tool.Descriptor{}, Built: time.Now()}
	lock := r.lock.Load()
	var errs []error
	for _, src := range listed {
		// A tool whose x-mcp-header annotations break SEP-2243 is left out:
		// clients must refuse it, and capgate could not serve it.
		if err := paramheader.Valid(src.InputSchema); err != nil {
			if why := "x-mcp-header: " + err.Error(); r.noted[src.ID] != why {
				r.noted[src.ID] = why
				r.opts.Logger.Warn("tool refused: its x-mcp-header annotations are invalid", "tool", src.ID, "why", err.Error())
			}
			continue
		}
		d := src.Clone()
		listedDef := Definition(d)
		d.DefinitionHash = hashDefinition(listedDef)
		srcKey := string(d.Kind) + ":" + d.Source
		prefix, ok := r.opts.Prefixes[srcKey]
		if !ok {
			prefix = d.Source
		}
		d.ExposedName = ExposedName(prefix, d.Name)
		listedDesc := d.Description
		if o, ok := r.opts.Defaults[srcKey]; ok {
			applyOverride(d, o)
		}
		o, ok := r.opts.Overrides[d.ID]
		if ok {
			applyOverride(d, o)
			if o.Hidden {
				continue
			}
		}
		if d.Description != listedDesc {
			if s.listedDesc == nil {
				s.listedDesc = map[string]string{}
			}
			s.listedDesc[d.ID] = listedDesc
		}
		// Under require_lock, a missing lock pins nothing: every tool
		// waits for review, none is served unpinned.
		if lock != nil || r.opts.RequireLock {
			var pin string
			var pinned bool
			if lock != nil {
				pin, pinned = lock.Pins[d.ID]
			}
			switch {
			case pinned && pin != d.DefinitionHash:
				var note string
				if d.Quarantined, note = judge(pin, lock.Defs[pin], listedDef, d); d.Quarantined != "" {
					r.opts.Logger.Warn("tool quarantined", "tool", d.ID, "why", d.Quarantined)
				} else {
					if s.outdated == nil {
						s.outdated = map[string]string{}
					}
					s.outdated[d.ID] = note
					if r.noted[d.ID] != d.DefinitionHash {
						r.noted[d.ID] = d.DefinitionHash
						r.opts.Logger.Warn("tool runs under an outdated pin", "tool", d.ID, "note", note)
					}
				}
			case !pinned && r.opts.RequireLock:
				d.Quarantined = "it is not in capgate.lock and policy.require_lock is set; review it and run `capgate tools lock`"
			}
		}
		if prev, clash := s.byID[d.ID]; clash {
			errs = append(errs, fmt.Errorf("tool id %s is listed twice (exposed as %s and %s)", d.ID, prev.ExposedName, d.ExposedName))
			continue
		}
		if prev, clash := s.byName[d.ExposedName]; clash {
			errs = append(errs, fmt.Errorf("tools %s and %s have one exposed name %q; set a prefix or a name override for one of them",
				prev.ID, d.ID, d.ExposedName))
			continue
		}
		s.byID[d.ID] = d
		s.byName[d.ExposedName] = d
		s.Tools = append(s.Tools, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.Slice(s.Tools, func(i, j int) bool { return s.Tools[i].ID < s.Tools[j].ID })
	for _, d := range s.Tools {
		s.search = append(s.search, strings.ToLower(d.ID+"\x00"+d.ExposedName+"\x00"+d.Description))
	}
	return s, nil
}

func applyOverride(d *tool.Descriptor, o Override) {
	if o.Level != risk.Unset {
		d.Risk.Level, d.Risk.LevelFrom = o.Level, risk.FromOperator
	}
	if o.Effects != nil {
		d.Risk.Effects, d.Risk.EffectsFrom = slices.Clone(o.Effects), risk.FromOperator
	}
	if o.Description != "" {
		d.Description = o.Description
	}
	if o.Name != "" {
		d.ExposedName = o.Name
	}
}

// Run refreshes on every TTL and whenever a source reports a change, until
// ctx ends. Errors are logged; the previous snapshot stays.
func (r *Registry) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.TTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.changed:
		}
		if err := r.Refresh(ctx); err != nil {
			r.opts.Logger.Error("catalog refresh failed; keeping the previous catalog", "err", err)
		}
	}
}

// Close closes every source that holds processes or connections.
func (r *Registry) Close() error {
	var errs []error
	for _, s := range r.sources {
		if c, ok := s.(tool.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", SourceKey(s), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Snapshot is one immutable catalog. Its descriptors are shared: copy one
// (Clone) before changing it.
type Snapshot struct {
	Tools  []*tool.Descriptor // sorted by id
	Built  time.Time
	byID   map[string]*tool.Descriptor
	byName map[string]*tool.Descriptor
	search []string // lower-cased id, exposed name and description, per tool
	// listedDesc are the descriptions sources listed, of the tools whose
	// description an operator overrides (Definition needs them).
	listedDesc map[string]string
	down       map[string]error // sources whose listing failed, by key
	// downNames maps the exposed-name prefix ("files__") of each down
	// source that has one to its key.
	downNames map[string]string
	// outdated are the notes on tools that run under an outdated pin
	// (one from before launches were pinned, or whose guarantees only
	// tightened), by id.
	outdated map[string]string
}

// OutdatedPin is, for a tool that runs though its definition no longer
// hashes to its pin (the pin predates what capgate pins now, or only its
// guarantees tightened), what the operator should do; "" for any other.
func (s *Snapshot) OutdatedPin(id string) string { return s.outdated[id] }

// Definition is the definition of the tool id as its source listed it
// (before operator overrides): what DefinitionHash hashes.
func (s *Snapshot) Definition(id string) (json.RawMessage, bool) {
	d, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	if desc, ok := s.listedDesc[id]; ok {
		c := *d
		c.Description = desc
		d = &c
	}
	return Definition(d), true
}

// Lock pins tools, all of this snapshot, with their definitions.
func (s *Snapshot) Lock(tools []*tool.Descriptor) *Lock {
	l := &Lock{Pins: map[string]string{}, Defs: map[string]json.RawMessage{}}
	for _, d := range tools {
		l.Pins[d.ID] = d.DefinitionHash
		if def, ok := s.Definition(d.ID); ok {
			l.Defs[d.DefinitionHash] = def
		}
	}
	return l
}

// Pinned is the pin of the tool id, and the pinned definition when the
// lock keeps it.
func (r *Registry) Pinned(id string) (hash string, def json.RawMessage, ok bool) {
	l := r.lock.Load()
	if l == nil {
		return "", nil, false
	}
	if hash, ok = l.Pins[id]; ok {
		def = l.Defs[hash]
	}
	return hash, def, ok
}

// SetLock replaces the pins (an operator pinned a reviewed definition)
// and rebuilds the catalog under them.
func (r *Registry) SetLock(ctx context.Context, l *Lock) error {
	r.lock.Store(l)
	return r.Refresh(ctx)
}

// Down is why the source with key ("mcp:files") failed to list its tools
// at this snapshot's refresh (a server that would not start), or nil.
func (s *Snapshot) Down(key string) error { return s.down[key] }

// AnyDown reports whether any source failed to list at this refresh.
func (s *Snapshot) AnyDown() bool { return len(s.down) > 0 }

// DownTool is, for a tool the catalog lacks, the id it would have and why
// its source is down, when name is a tool id ("mcp:files:read") or an
// exposed name ("files__read") of a source whose listing failed (a stdio
// server that would not start); a nil err otherwise. An exposed name
// without a prefix cannot be told apart from any other unknown name.
func (s *Snapshot) DownTool(name string) (id string, err error) {
	if kind, rest, found := strings.Cut(name, ":"); found {
		if source, _, found := strings.Cut(rest, ":"); found {
			return name, s.down[kind+":"+source]
		}
		return "", nil
	}
	for prefix, key := range s.downNames {
		if rest, found := strings.CutPrefix(name, prefix); found && rest != "" {
			return key + ":" + rest, s.down[key]
		}
	}
	return "", nil
}

// Lookup finds a tool by id.
func (s *Snapshot) Lookup(id string) (*tool.Descriptor, bool) {
	d, ok := s.byID[id]
	return d, ok
}

// ByExposedName finds a tool by the name clients see.
func (s *Snapshot) ByExposedName(name string) (*tool.Descriptor, bool) {
	d, ok := s.byName[name]
	return d, ok
}

// Filter selects tools. The zero Filter selects everything.
type Filter struct {
	MaxRisk        risk.Level        // Unset: no limit
	ExcludeEffects []risk.SideEffect // tools with any of these are left out
	Kinds          []tool.Kind       // empty: every kind
	AvailableOnly  bool
	Query          string // case-insensitive substring of id, name or description
}

// List returns the tools that pass f, in id order.
func (s *Snapshot) List(f Filter) []*tool.Descriptor {
	q := strings.ToLower(strings.TrimSpace(f.Query))
	var out []*tool.Descriptor
	for i, d := range s.Tools {
		if f.MaxRisk != risk.Unset && d.Risk.Level > f.MaxRisk {
			continue
		}
		if f.AvailableOnly && (!d.Available || d.Quarantined != "") {
			continue
		}
		if len(f.Kinds) > 0 && !slices.Contains(f.Kinds, d.Kind) {
			continue
		}
		if len(f.ExcludeEffects) > 0 && slices.ContainsFunc(d.Risk.Effects, func(e risk.SideEffect) bool {
			return slices.Contains(f.ExcludeEffects, e)
		}) {
			continue
		}
		if q != "" && !strings.Contains(s.search[i], q) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// Call runs a tool of the current catalog by id. A quarantined tool is
// never run, an unavailable one fails fast, and the source gets the
// catalog's own descriptor, not whatever the caller holds.
func (r *Registry) Call(ctx context.Context, id string, c tool.Call) (*tool.Result, error) {
	d, ok := r.Snapshot().Lookup(id)
	if !ok {
		return nil, tool.Errorf(tool.CodeNotFound, "no tool %s", id)
	}
	if d.Quarantined != "" {
		return nil, &tool.Error{Code: tool.CodeAccessDenied, Message: fmt.Sprintf("%s is quarantined: %s", id, d.Quarantined),
			Gate: "definition_pin", Hint: "an operator reviews the new definition and runs `capgate tools lock`"}
	}
	if !d.Available {
		if err := r.Snapshot().Down(string(d.Kind) + ":" + d.Source); err != nil {
			return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s is unavailable: its source %s:%s is down: %v", id, d.Kind, d.Source, err)
		}
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "%s is unavailable: its source is not answering", id)
	}
	src, ok := r.Source(d)
	if !ok {
		return nil, tool.Errorf(tool.CodeNotFound, "no source for %s", id)
	}
	c.Tool = d
	r.inflight.Add(1)
	defer r.inflight.Add(-1)
	return src.Call(ctx, c)
}

// Hold counts a call bound for the registry's sources from before its
// gates run, so that Drain waits for it too; Release ends it.
func (r *Registry) Hold() { r.inflight.Add(1) }

// Release ends what Hold began.
func (r *Registry) Release() { r.inflight.Add(-1) }

// Drain waits until no call is running in the registry's sources, or ctx
// ends: a reload closes a registry it replaced only after its calls
// finished.
func (r *Registry) Drain(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for r.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d calls still running: %w", r.inflight.Load(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Sources returns the sources, in configuration order.
func (r *Registry) Sources() []tool.Source { return slices.Clone(r.sources) }

// Prefix is the prefix of the exposed names of source key
// ("<kind>:<source>"): the configured one, else the source id.
func (r *Registry) Prefix(key string) string {
	if p, ok := r.opts.Prefixes[key]; ok {
		return p
	}
	_, id, _ := strings.Cut(key, ":")
	return id
}
