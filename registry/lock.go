package registry

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// LockFile is the default name of the definition pins.
const LockFile = "capgate.lock"

// Lock pins tool definitions, like go.sum: one line per tool id with a
// hash of what the model is told about it.
type Lock struct {
	Pins map[string]string // tool id → "sha256:<hex>"
	// Defs are the pinned definitions themselves, by hash, from the
	// sidecar capgate.lock.defs: what an operator reviewing a changed tool
	// compares the new definition with. Each is checked against its hash
	// when read; one missing only means no diff can be shown.
	Defs map[string]json.RawMessage
}

// DefsSuffix names the sidecar of a lock file that keeps the pinned
// definitions (capgate.lock.defs): one JSON object per line.
const DefsSuffix = ".defs"

// DefinitionHash hashes what a tool says about itself: its source's name,
// description, schemas and annotations, as the source gave them (before
// operator overrides), so an upstream that quietly changes its tool is
// noticed.
func DefinitionHash(d *tool.Descriptor) string { return hashDefinition(Definition(d)) }

func hashDefinition(def []byte) string {
	sum := sha256.Sum256(def)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// definition is what DefinitionHash hashes, as JSON.
type definition struct {
	Name         string           `json:"name"`
	Title        string           `json:"title,omitempty"`
	Description  string           `json:"description"`
	InputSchema  json.RawMessage  `json:"input_schema,omitempty"`
	OutputSchema json.RawMessage  `json:"output_schema,omitempty"`
	Annotations  tool.Annotations `json:"annotations"`
	Launch       json.RawMessage  `json:"launch,omitempty"`
}

// Definition is the JSON document DefinitionHash hashes: the tool's name,
// title, description, schemas, annotations and launch.
func Definition(d *tool.Descriptor) json.RawMessage {
	b, _ := json.Marshal(definition{d.Name, d.Title, d.Description, compact(d.InputSchema), compact(d.OutputSchema), d.Annotations, compact(d.Launch)})
	return b
}

// compact removes insignificant white space, so formatting is not a change.
func compact(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// ReadLock reads a lock file. A missing file is (nil, nil): nothing pinned.
func ReadLock(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l := &Lock{Pins: map[string]string{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[1], "sha256:") {
			return nil, fmt.Errorf("%s:%d: want \"<tool id> sha256:<hex>\"", path, n)
		}
		if _, dup := l.Pins[f[0]]; dup {
			return nil, fmt.Errorf("%s:%d: %s is pinned twice", path, n, f[0])
		}
		l.Pins[f[0]] = f[1]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if l.Defs, err = readDefs(path + DefsSuffix); err != nil {
		return nil, err
	}
	return l, nil
}

// pinnedDef is one line of the definitions sidecar.
type pinnedDef struct {
	Hash       string          `json:"hash"`
	Definition json.RawMessage `json:"definition"`
}

// readDefs reads a definitions sidecar; a definition that does not match
// its hash is left out (edited by hand, or cut short).
func readDefs(path string) (map[string]json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, err
	}
	defs := map[string]json.RawMessage{}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		var p pinnedDef
		if json.Unmarshal(line, &p) != nil || hashDefinition(p.Definition) != p.Hash {
			continue
		}
		defs[p.Hash] = p.Definition
	}
	return defs, nil
}

// Write writes the lock and its definitions sidecar (only the definitions
// its pins name), each replaced whole.
func (l *Lock) Write(path string) error {
	var b strings.Builder
	b.WriteString("# capgate.lock: tool definition pins, written by `capgate tools lock`.\n")
	b.WriteString("# A tool whose definition no longer matches its pin is quarantined.\n")
	lines := make([]string, 0, len(l.Pins))
	for id, h := range l.Pins {
		lines = append(lines, id+" "+h)
	}
	slices.Sort(lines)
	for _, line := range lines {
		b.WriteString(line + "\n")
	}
	var defs bytes.Buffer
	for _, h := range slices.Compact(slices.Sorted(maps.Values(l.Pins))) {
		if def, ok := l.Defs[h]; ok {
			line, err := json.Marshal(pinnedDef{Hash: h, Definition: def})
			if err != nil {
				return err
			}
			defs.Write(append(line, '\n'))
		}
	}
	if err := writeReplace(path+DefsSuffix, defs.Bytes()); err != nil {
		return err
	}
	return writeReplace(path, []byte(b.String()))
}

// writeReplace replaces path's content at once (a temp file renamed over
// it), so that a serve reading it never sees half.
func writeReplace(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// WriteLock pins every tool of tools, with its definition where its
// descriptor still says what the source listed (Snapshot.Lock also keeps
// those whose description an operator overrides).
func WriteLock(path string, tools []*tool.Descriptor) error {
	l := &Lock{Pins: map[string]string{}, Defs: map[string]json.RawMessage{}}
	for _, d := range tools {
		l.Pins[d.ID] = d.DefinitionHash
		if def := Definition(d); hashDefinition(def) == d.DefinitionHash {
			l.Defs[d.DefinitionHash] = def
		}
	}
	return l.Write(path)
}

// judge is the lock's word on d, whose definition (listed, before
// overrides) no longer hashes to its pin; def is the pinned definition
// when the lock's sidecar keeps it. quarantine is why d may not run ("":
// it may); note, when it may, what the operator should still do.
//
// d may run when only its declared guarantees tightened (the launcher
// enforces the new ones), or when its pin predates launch pins (a
// capgate.lock written before capgate pinned how MCP servers and bridge
// providers start, or an extension command's launch as a digest): that
// pin still vouches for everything it covered, and `capgate tools lock`
// adds the launch.
func judge(pin string, def, listed json.RawMessage, d *tool.Descriptor) (quarantine, note string) {
	const review = "; review it and run `capgate tools lock`"
	var now sandbox.Launch
	if len(d.Launch) > 0 && json.Unmarshal(d.Launch, &now) == nil {
		legacy, _ := json.Marshal(now.Digest())
		for _, old := range []json.RawMessage{nil, legacy} {
			if hashDefinition(withLaunch(listed, old)) == pin {
				return "", "capgate.lock pinned it before it pinned launches (run, program digest, declared guarantees); run `capgate tools lock` to pin them"
			}
		}
		// Pinned whole, before file digests: the same launch, whose
		// files (if its run names any) the pin does not vouch for.
		if hashDefinition(withLaunch(listed, now.V1())) == pin {
			return "", unpinnedFiles(sandbox.UnpinnedFiles(sandbox.Launch{}, now))
		}
	}
	if len(def) == 0 || !bytes.Equal(withLaunch(def, nil), withLaunch(listed, nil)) {
		return "its definition changed since capgate.lock pinned it" + review, ""
	}
	var pinned struct {
		Launch *sandbox.Launch `json:"launch"`
	}
	if json.Unmarshal(def, &pinned) != nil || pinned.Launch == nil || len(d.Launch) == 0 {
		return "its run, program or declared guarantees changed since capgate.lock pinned it" + review, ""
	}
	changes, loosened := sandbox.CompareLaunch(*pinned.Launch, now)
	switch {
	case loosened:
		return "its run, program or declared guarantees changed since capgate.lock pinned it (" + strings.Join(changes, ", ") + ")" + review, ""
	case len(changes) > 0:
		return "", "its declared guarantees only tightened since capgate.lock pinned it (" + strings.Join(changes, ", ") + "); run `capgate tools lock` to pin them"
	}
	return "", unpinnedFiles(sandbox.UnpinnedFiles(*pinned.Launch, now))
}

// unpinnedFiles is the note on a tool whose pin does not vouch for files,
// the files its run names; "" for none.
func unpinnedFiles(files []string) string {
	if len(files) == 0 {
		return ""
	}
	return "capgate.lock pinned it before it digested the files its run names (" + strings.Join(files, ", ") + "); run `capgate tools lock` to pin them"
}

// withLaunch is the definition def with its launch replaced by launch
// (nil: none), for comparing definitions apart from their launch and for
// reproducing pins written before launches were pinned whole.
func withLaunch(def, launch json.RawMessage) []byte {
	var d definition
	if json.Unmarshal(def, &d) != nil {
		return nil
	}
	d.Launch = launch
	b, _ := json.Marshal(d)
	return b
}

// Refuses is the lock's word on a process capgate is about to start (a
// stdio MCP server, a bridge provider), before it starts it: when the
// launch now loosens one pinned for any tool of source (a new run or
// program, a dropped guarantee, ...), changes names each change and tools
// are the source's pinned tools, rebuilt from the definitions the lock
// keeps, each with launch now, for the registry to list quarantined (its
// judge names the same changes). The process is never started, so a
// rewritten program or script cannot run even to list its tools.
//
// Nothing is refused when no pin of source has a launch to compare with
// (none pinned, pins from before launches were pinned, or a sidecar that
// lacks the definitions): then the tools are judged once listed.
func (l *Lock) Refuses(kind tool.Kind, source string, launch json.RawMessage) (tools []*tool.Descriptor, changes []string) {
	var now sandbox.Launch
	if l == nil || len(launch) == 0 || json.Unmarshal(launch, &now) != nil {
		return nil, nil
	}
	prefix := string(kind) + ":" + source + ":"
	loosened := false
	for _, id := range slices.Sorted(maps.Keys(l.Pins)) {
		name, ok := strings.CutPrefix(id, prefix)
		if !ok {
			continue
		}
		var def definition
		var pinned sandbox.Launch
		if raw := l.Defs[l.Pins[id]]; json.Unmarshal(raw, &def) != nil || len(def.Launch) == 0 ||
			json.Unmarshal(def.Launch, &pinned) != nil {
			continue
		}
		c, loose := sandbox.CompareLaunch(pinned, now)
		loosened = loosened || loose
		for _, change := range c {
			if !slices.Contains(changes, change) {
				changes = append(changes, change)
			}
		}
		tools = append(tools, &tool.Descriptor{ID: id, Kind: kind, Source: source, Name: name,
			Title: def.Title, Description: def.Description, InputSchema: def.InputSchema, OutputSchema: def.OutputSchema,
			Annotations: def.Annotations, Launch: launch})
	}
	if !loosened {
		return nil, nil
	}
	return tools, changes
}

// Launches are the launches l pins for the tools of kind:source (of tool
// name alone when name is not ""), for checking at each start
// (sandbox.Hold); none from pins that predate launch pins or a sidecar
// that lacks the definitions, as for Refuses.
func (l *Lock) Launches(kind tool.Kind, source, name string) []sandbox.Launch {
	if l == nil {
		return nil
	}
	prefix := string(kind) + ":" + source + ":"
	var out []sandbox.Launch
	for _, id := range slices.Sorted(maps.Keys(l.Pins)) {
		n, ok := strings.CutPrefix(id, prefix)
		if !ok || (name != "" && n != name) {
			continue
		}
		var def definition
		var pinned sandbox.Launch
		if json.Unmarshal(l.Defs[l.Pins[id]], &def) != nil || len(def.Launch) == 0 ||
			json.Unmarshal(def.Launch, &pinned) != nil {
			continue
		}
		out = append(out, pinned)
	}
	return out
}
