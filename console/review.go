package console

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kylelemons/godebug/diff"

	"github.com/capgate/capgate/audit"
)

// Pins lets operators review a quarantined tool, whose definition no
// longer matches its pin, and pin the new definition.
type Pins interface {
	// Review is the tool's pinned definition (nil when the lock does not
	// keep it, or pins nothing for the tool) and its definition now, as
	// its source lists it, with that definition's hash.
	Review(id string) (pinned, now json.RawMessage, nowHash string, ok bool)
	// Pin pins the tool's definition now, if its hash is still hash (what
	// the operator reviewed), and rebuilds the catalog under the new pin.
	Pin(ctx context.Context, id, hash string) error
}

// diffLine is one line of a definition's diff: Op is "+", "-" or " ".
type diffLine struct{ Op, Text string }

// fieldDiff is one field of a definition that changed.
type fieldDiff struct {
	Field string
	Lines []diffLine
}

// review is what the catalog shows of a quarantined tool.
type review struct {
	ID        string // the tool's
	Hash      string // of the definition now: what Pin takes
	NoPinned  bool   // nothing pinned to compare with
	Fields    []fieldDiff
	Unchanged []string // fields that did not change
}

// definitionFields are a definition's fields, in the order shown.
var definitionFields = []string{"name", "title", "description", "input_schema", "output_schema", "annotations"}

// reviewOf compares a pinned definition with the one now, field by field,
// as line diffs of the fields' indented JSON (a description as its text).
func reviewOf(id string, pinned, now json.RawMessage, hash string) *review {
	rv := &review{ID: id, Hash: hash, NoPinned: pinned == nil}
	var old, cur map[string]json.RawMessage
	json.Unmarshal(pinned, &old)
	json.Unmarshal(now, &cur)
	for _, f := range definitionFields {
		a, b := fieldText(old[f]), fieldText(cur[f])
		if a == b {
			if a != "" {
				rv.Unchanged = append(rv.Unchanged, f)
			}
			continue
		}
		fd := fieldDiff{Field: f}
		for _, ch := range diff.DiffChunks(lines(a), lines(b)) {
			for _, l := range ch.Deleted {
				fd.Lines = append(fd.Lines, diffLine{"-", l})
			}
			for _, l := range ch.Added {
				fd.Lines = append(fd.Lines, diffLine{"+", l})
			}
			for _, l := range ch.Equal {
				fd.Lines = append(fd.Lines, diffLine{" ", l})
			}
		}
		rv.Fields = append(rv.Fields, fd)
	}
	return rv
}

// fieldText is a field's value for reading: a string as its text,
// anything else as indented JSON; "" when absent.
func fieldText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return pretty(raw)
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// pinTool pins the reviewed definition of a quarantined tool.
func (c *Console) pinTool(w http.ResponseWriter, r *http.Request) {
	v := visitorOf(r.Context())
	if c.opts.Pins == nil {
		http.Error(w, "404 definition pins are not kept here", http.StatusNotFound)
		return
	}
	id, hash := r.PostForm.Get("id"), r.PostForm.Get("hash")
	err := c.opts.Pins.Pin(r.Context(), id, hash)
	ev := audit.Event{Type: audit.TypeOperator, Sub: v.Sub, Decision: "pin_definition", Gate: "console", Tool: id,
		Detail: "pinned " + hash}
	if err != nil {
		ev.Code, ev.Detail = "refused", err.Error()
	}
	c.opts.Record(ev)
	if err != nil {
		http.Error(w, "409 "+err.Error(), http.StatusConflict)
		return
	}
	http.Redirect(w, r, "/catalog", http.StatusSeeOther)
}
