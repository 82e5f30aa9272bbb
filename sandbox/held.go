package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/tool"
)

// Held is a launch capgate.lock pins, checked again at each start: the
// program and the files its run names, each against its pinned sha256.
// The judge compares them only when sources are built (start, reload,
// tools list); without Held a script rewritten in between would run at its
// next start. A file is hashed again only when its stat (device, inode,
// size, mtime, ctime) differs from the one it last matched its pin with,
// so an unchanged launch costs a stat per file. What the kernel does
// between this check and the exec is outside it, as for the judge.
type Held struct {
	id    string // the tool or source it starts, for the log
	log   func(msg string, args ...any)
	files []*heldFile
}

type heldFile struct {
	name string // "program", or the argument as pinned
	path string
	sum  string // the pinned sha256; "" when the argument named no file
	mu   sync.Mutex
	seen stamp // the stat with which it last matched sum; zero: none yet
}

// Hold is the check at each start of argv run from dir (resolved as
// NewLaunch does) against pins, the launches capgate.lock pins for id;
// nil (no check) when there are none. log is told of each refusal.
func Hold(id string, argv []string, dir string, log func(string, ...any), pins ...Launch) *Held {
	if len(pins) == 0 || len(argv) == 0 {
		return nil
	}
	h := &Held{id: id, log: log}
	prog, err := program(argv[0], dir)
	if err != nil {
		prog = "" // missing now: it stays missing or it is a change
	}
	// Each tool of a source pins the same launch: each file once.
	add := func(f *heldFile) {
		if !slices.ContainsFunc(h.files, func(g *heldFile) bool { return g.name == f.name && g.sum == f.sum }) {
			h.files = append(h.files, f)
		}
	}
	for _, pin := range pins {
		add(&heldFile{name: "program", path: prog, sum: pin.Program})
		if pin.Files == nil {
			continue // pinned before files were digested: it vouches for none (judge)
		}
		for _, a := range argv[1:] {
			if a == "" {
				continue
			}
			p := a
			if !filepath.IsAbs(p) && dir != "" {
				p = filepath.Join(dir, p)
			}
			add(&heldFile{name: a, path: p, sum: pin.Files[a]})
		}
	}
	return h
}

// Check is nil when every file still has its pinned sha256; otherwise a
// *ChangedError naming each change, as the judge names it (CompareLaunch),
// and the launch must not start. A file that vanished or cannot be read
// is a change. Nil h checks nothing.
func (h *Held) Check() error {
	if h == nil {
		return nil
	}
	var changes []string
	for _, f := range h.files {
		if c := f.check(); c != "" {
			changes = append(changes, c)
		}
	}
	if len(changes) == 0 {
		return nil
	}
	if h.log != nil {
		h.log("not started: its run, program or declared guarantees changed since capgate.lock pinned it; it stays refused until an operator reviews it and runs `capgate tools lock`",
			"tool", h.id, "changes", strings.Join(changes, ", "))
	}
	return &ChangedError{ID: h.id, Changes: changes}
}

// racy is how recent a change may be for its stat not to vouch for the
// content: a write in the same clock tick as the stat leaves it as it was
// (git's "racy clean" problem), so such a file is hashed again next time.
var racy = 2 * time.Second

func (f *heldFile) check() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, regular := stampOf(f.path)
	if f.sum == "" { // the argument named no file when pinned
		if regular {
			return fmt.Sprintf("file %s sha256 (not a file when pinned) → %s", f.name, short(digest(f.path)))
		}
		return ""
	}
	if st.valid && st == f.seen {
		return ""
	}
	now := "missing"
	if f.path != "" && (regular || f.name == "program") {
		now = digest(f.path)
	}
	if now != f.sum {
		f.seen = stamp{}
		if f.name == "program" {
			return fmt.Sprintf("program sha256 %s → %s", short(f.sum), short(now))
		}
		if now == "missing" {
			return fmt.Sprintf("file %s sha256 %s → (no longer a file)", f.name, short(f.sum))
		}
		return fmt.Sprintf("file %s sha256 %s → %s", f.name, short(f.sum), short(now))
	}
	if st.valid && time.Since(st.changed) > racy {
		f.seen = st
	}
	return ""
}

// ChangedError is a start Held refused: the launch changed on disk since
// capgate.lock pinned it.
type ChangedError struct {
	ID      string
	Changes []string
}

func (e *ChangedError) Error() string {
	return "its run, program or declared guarantees changed since capgate.lock pinned it (" + strings.Join(e.Changes, ", ") +
		"); review it and run `capgate tools lock`"
}

// Refusal is the caller's error for e: access denied by the definition
// pin, as for a tool the judge quarantined.
func (e *ChangedError) Refusal() *tool.Error {
	return &tool.Error{Code: tool.CodeAccessDenied, Gate: "definition_pin", Message: e.ID + " not run: " + e.Error(), Err: e}
}
