package risk

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// Hints are what a tool says about itself that inference reads.
type Hints struct {
	Name        string
	Description string
	// MCP tool annotations; nil when the tool does not say.
	ReadOnly    *bool
	Destructive *bool
	OpenWorld   *bool
	// TrustAnnotations: the operator vouches for the annotations. Without
	// it they come from an upstream that could say anything, so they may
	// raise the level but never lower it (MCP: annotations are hints, not
	// to be relied on from untrusted servers).
	TrustAnnotations bool
	// Permissions of an extension pack (payments, cloud, network, ...).
	Permissions []string
}

// Declaration is a level and side effects set by an operator or declared
// by a source. Unset Level and nil Effects mean "not said"; a non-nil empty
// Effects says "no side effects".
type Declaration struct {
	Level   Level
	Effects []SideEffect
}

// Assessment is a tool's level and side effects, each with where it came
// from, and the inference rules that fired.
type Assessment struct {
	Level       Level        `json:"level"`
	LevelFrom   Provenance   `json:"level_from"`
	Effects     []SideEffect `json:"side_effects"`
	EffectsFrom Provenance   `json:"side_effects_from"`
	Rules       []string     `json:"rules,omitempty"`
}

// Assess settles a tool's level and side effects, each on its own: the
// operator's setting wins, then the source's declaration, then inference.
func Assess(operator, declared Declaration, h Hints) Assessment {
	inferred := Infer(h)
	a := inferred
	switch {
	case operator.Level != Unset:
		a.Level, a.LevelFrom = operator.Level, FromOperator
	case declared.Level != Unset:
		a.Level, a.LevelFrom = declared.Level, FromSource
	}
	switch {
	case operator.Effects != nil:
		a.Effects, a.EffectsFrom = slices.Clone(operator.Effects), FromOperator
	case declared.Effects != nil:
		a.Effects, a.EffectsFrom = slices.Clone(declared.Effects), FromSource
	}
	if a.LevelFrom != FromInference && a.EffectsFrom != FromInference {
		a.Rules = nil // nothing inferred was used
	}
	return a
}

// wordRule is one keyword of the name-and-description inference.
type wordRule struct {
	level  Level
	effect func(db bool) SideEffect // nil: no effect
}

func fsOrDB(fs, db SideEffect) func(bool) SideEffect {
	return func(isDB bool) SideEffect {
		if isDB {
			return db
		}
		return fs
	}
}

func always(e SideEffect) func(bool) SideEffect { return func(bool) SideEffect { return e } }

var wordRules = map[string]wordRule{
	// CRITICAL: money and secrets.
	"payment": {Critical, always(Payments)}, "pay": {Critical, always(Payments)},
	"charge": {Critical, always(Payments)}, "purchase": {Critical, always(Payments)},
	"secret": {Critical, always(CloudKeyRead)}, "credential": {Critical, always(CloudKeyRead)},
	"password": {Critical, always(CloudKeyRead)},
	// HIGH: destroying, changing, executing.
	"delete": {High, fsOrDB(FSDelete, DatabaseDelete)}, "remove": {High, fsOrDB(FSDelete, DatabaseDelete)},
	"drop": {High, fsOrDB(FSDelete, DatabaseDelete)}, "destroy": {High, fsOrDB(FSDelete, DatabaseDelete)},
	"rm": {High, fsOrDB(FSDelete, DatabaseDelete)}, "erase": {High, fsOrDB(FSDelete, DatabaseDelete)},
	"purge": {High, fsOrDB(FSDelete, DatabaseDelete)},
	"write": {High, fsOrDB(FSWrite, DatabaseWrite)}, "update": {High, fsOrDB(FSWrite, DatabaseWrite)},
	"modify": {High, fsOrDB(FSWrite, DatabaseWrite)},
	"exec":   {High, always(SystemExec)}, "execute": {High, always(SystemExec)},
	"run": {High, always(SystemExec)}, "shell": {High, always(SystemExec)},
	// LOW: looking.
	"get": {Low, nil}, "list": {Low, nil}, "search": {Low, nil}, "show": {Low, nil},
	"find": {Low, nil}, "view": {Low, nil},
	"read": {Low, fsOrDB(FSRead, DatabaseRead)},
}

// databaseWords move the effects of a tool from files to a database.
var databaseWords = []string{"sql", "database", "db", "table", "row", "rows", "query", "record", "records"}

// Infer guesses a level and side effects, recording each rule that fired.
// The level comes from the first of these that gives one:
//  1. MCP annotations, when trusted: readOnlyHint → LOW (and no write
//     effects), destructiveHint → HIGH; openWorldHint adds network.http
//     trusted or not;
//  2. extension permissions: payment(s), cloud → CRITICAL; network → HIGH;
//  3. words of the name and of the description: split on _ - . / white
//     space and camelCase, so "format" is not "rm" and "thread" is not
//     "read"; the highest keyword of either wins, so get_thing described
//     as "deletes all user data" is HIGH, not LOW;
//  4. MED.
//
// Untrusted, readOnlyHint is ignored (it could only lower), and
// destructiveHint raises the level to at least MED, not HIGH: it is the
// MCP default (mcp-go stamps it on every tool), so it says only that the
// tool is not known to be read-only; words still make a tool HIGH.
//
// Side effects gather from every rule that fired.
func Infer(h Hints) Assessment {
	a := Assessment{LevelFrom: FromInference, EffectsFrom: FromInference}
	effects := map[SideEffect]bool{}
	trusted := h.TrustAnnotations
	readOnly := trusted && h.ReadOnly != nil && *h.ReadOnly
	destructive := h.Destructive != nil && *h.Destructive
	fire := func(l Level, rule string, e ...SideEffect) {
		if a.Level == Unset && l != Unset {
			a.Level = l
		}
		for _, x := range e {
			if readOnly && x.Writes() {
				continue
			}
			effects[x] = true
		}
		a.Rules = append(a.Rules, rule)
	}

	switch {
	case !trusted && h.ReadOnly != nil && *h.ReadOnly:
		fire(Unset, "annotation readOnlyHint ignored: the server's annotations are not trusted")
	case !trusted:
	case readOnly:
		fire(Low, "annotation readOnlyHint → LOW, no write effects")
	case destructive:
		fire(High, "annotation destructiveHint → HIGH")
	}
	if h.OpenWorld != nil && *h.OpenWorld {
		fire(Unset, "annotation openWorldHint → network.http", NetworkHTTP)
	}

	for _, p := range h.Permissions {
		switch perm := strings.ToLower(strings.TrimSpace(p)); perm {
		case "payment", "payments":
			fire(Critical, fmt.Sprintf("permission %q → CRITICAL, payments", p), Payments)
		case "cloud":
			fire(Critical, fmt.Sprintf("permission %q → CRITICAL, cloud.resource_create", p), CloudResourceCreate)
		case "network":
			fire(High, fmt.Sprintf("permission %q → HIGH, network.http", p), NetworkHTTP)
		default:
			if e, err := ParseSideEffect(perm); err == nil {
				fire(Unset, fmt.Sprintf("permission %q → %s", p, e), e)
			}
		}
	}

	nameWords, descWords := splitWords(h.Name), splitWords(h.Description)
	isDB := false
	for _, w := range append(slices.Clone(nameWords), descWords...) {
		if slices.Contains(databaseWords, w) {
			isDB = true
			break
		}
	}
	words := Unset // the highest level a keyword of the name or description gives
	for _, src := range []struct {
		where string
		words []string
	}{{"name", nameWords}, {"description", descWords}} {
		fired := false
		best := Unset
		var rules []string
		var found []SideEffect
		for _, w := range src.words {
			kw, r, ok := lookupWord(w)
			if !ok {
				continue
			}
			fired = true
			best = max(best, r.level)
			rule := fmt.Sprintf("word %q in %s → %s", kw, src.where, r.level)
			if r.effect != nil {
				e := r.effect(isDB)
				found = append(found, e)
				rule += ", " + string(e)
			}
			if !slices.Contains(rules, rule) {
				rules = append(rules, rule)
			}
		}
		if fired {
			a.Rules = append(a.Rules, rules...)
			words = max(words, best)
			for _, e := range found {
				if !(readOnly && e.Writes()) {
					effects[e] = true
				}
			}
		}
	}
	if a.Level == Unset {
		a.Level = words // the higher of the name's and the description's
	}

	if !trusted && destructive && a.Level < Med {
		a.Level = Med // raises only: Unset and LOW are below MED
		a.Rules = append(a.Rules, "annotation destructiveHint (not trusted) → at least MED")
	}
	if a.Level == Unset {
		a.Level = Med
		a.Rules = append(a.Rules, "no rule gave a level → MED")
	}
	a.Effects = make([]SideEffect, 0, len(effects))
	for _, e := range SideEffects { // stable order
		if effects[e] {
			a.Effects = append(a.Effects, e)
		}
	}
	return a
}

// lookupWord finds the keyword a word is, allowing plain inflections:
// deletes, deleted, deleting, running, dropped, writing, written.
func lookupWord(w string) (string, wordRule, bool) {
	if r, ok := wordRules[w]; ok {
		return w, r, true
	}
	try := func(stem string) (string, wordRule, bool) {
		r, ok := wordRules[stem]
		return stem, r, ok
	}
	for _, suf := range []string{"s", "es", "ed", "d", "ing"} {
		if stem, ok := strings.CutSuffix(w, suf); ok && stem != "" {
			if kw, r, ok := try(stem); ok {
				return kw, r, true
			}
			// running → run, dropped → drop
			if n := len(stem); n >= 2 && stem[n-1] == stem[n-2] && (suf == "ing" || suf == "ed") {
				if kw, r, ok := try(stem[:n-1]); ok {
					return kw, r, true
				}
			}
			// writing → write, deleting → delete
			if suf == "ing" {
				if kw, r, ok := try(stem + "e"); ok {
					return kw, r, true
				}
			}
		}
	}
	if w == "written" {
		return try("write")
	}
	return "", wordRule{}, false
}

// splitWords lowercases s and splits it into words at every character that
// is not a letter or digit, and at camelCase boundaries (readFile, HTTPGet).
func splitWords(s string) []string {
	var words []string
	rs := []rune(s)
	start := -1
	flush := func(end int) {
		if start >= 0 && end > start {
			words = append(words, strings.ToLower(string(rs[start:end])))
		}
		start = -1
	}
	for i, r := range rs {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			flush(i)
			continue
		}
		if start >= 0 && unicode.IsUpper(r) {
			prev := rs[i-1]
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				flush(i)
			}
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(rs))
	return words
}
