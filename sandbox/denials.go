package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Denials collects the guarantees the kernel refused one call's process
// (a socket under no_network, a process under no_subprocess), so that the
// call's error can name them and what would allow them.
type Denials struct {
	mu    sync.Mutex
	keys  []Key
	files []FileDenial
	// settle waits for the file denials still on their way (audit
	// records arrive after the tool's syscalls returned); deny are the
	// launch's deny paths, which no declaration opens.
	settle func()
	deny   []string
	// rules mirror the launch's Landlock rules, to check a file the tool
	// reports refused (Stderr) where no audit record named one (audited:
	// capgate reads the launch's records).
	rules   *rules
	audited bool
	// onFile, for a process that outlives calls (OnFile), is told of each
	// new file denial as the kernel's record arrives.
	onFile func(FileDenial)
}

// FileDenial is one file access Landlock refused a tool, as its audit
// record says: Blockers the access rights ("fs.read_file",
// "fs.write_file,fs.truncate"), Path the file. A denial the tool reported
// in its stderr (Stderr) has Blockers "reported:read" or "reported:write":
// what its rules withhold from that path.
// From says where a reported one was read ("its stderr").
type FileDenial struct{ Blockers, Path, From string }

// Reported reports whether f is the tool's own report, checked against
// its rules, rather than the kernel's record.
func (f FileDenial) Reported() bool { return strings.HasPrefix(f.Blockers, "reported:") }

// OnFile makes d the denials of a process that outlives calls (a stdio
// MCP server): its launch stays watched for the process's whole life, and
// f is told of each file the kernel refuses it, once per distinct access
// and path d still holds, as the record arrives (on the audit reader's
// goroutine: f must not block). Set it before the launch.
func (d *Denials) OnFile(f func(FileDenial)) {
	d.mu.Lock()
	d.onFile = f
	d.mu.Unlock()
}

// ForCall is an empty Denials for one call to d's long-lived process: the
// same deny paths and rules, for AddFile and Reported.
func (d *Denials) ForCall() *Denials {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &Denials{deny: d.deny, rules: d.rules, audited: d.audited}
}

// Audited reports whether capgate reads the kernel's records of d's
// launch (else only what the tool reports names a file).
func (d *Denials) Audited() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.audited
}

// AddFile records f, a denial of d's process attributed to this call.
func (d *Denials) AddFile(f FileDenial) { d.addFile(f) }

// maxFileDenials bounds what one call keeps: the last ones, the refusal
// a tool gives up on being most often its last.
const maxFileDenials = 4

func (d *Denials) addFile(f FileDenial) {
	d.mu.Lock()
	if slices.Contains(d.files, f) {
		d.mu.Unlock()
		return
	}
	if len(d.files) == maxFileDenials {
		d.files = d.files[1:]
	}
	d.files = append(d.files, f)
	onFile := d.onFile
	d.mu.Unlock()
	if onFile != nil && !f.Reported() {
		onFile(f)
	}
}

// named are the file denials worth naming: a runtime's probes of /sys
// (Go, the JVM and Node read cgroup and memory settings there at start,
// and carry on when refused) only when there is nothing else.
func (d *Denials) named() []FileDenial {
	var out []FileDenial
	for _, f := range d.files {
		if !under(f.Path, "/sys") {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return d.files
	}
	return out
}

func (d *Denials) setSettle(f func()) {
	d.mu.Lock()
	d.settle = f
	d.mu.Unlock()
}

// Observe is an observer for Confinement.ObservedBy that records each
// refusal and passes it on to next (the router's record), when set.
func (d *Denials) Observe(next func(string)) func(string) {
	return func(k string) {
		d.mu.Lock()
		if !slices.Contains(d.keys, Key(k)) {
			d.keys = append(d.keys, Key(k))
		}
		d.mu.Unlock()
		if next != nil {
			next(k)
		}
	}
}

// allowWith is the declaration that lifts each observed guarantee.
var allowWith = map[Key]string{NoNetwork: "network: outbound", NoSubprocess: "subprocess: allow"}

// Explain says what the kernel refused (msg, "" when nothing) and what
// would allow it (hint): the declaration in declare (where the tool's
// capabilities are written), the operator's override under overrideKey,
// or [trust], whichever set the guarantee.
func (d *Denials) Explain(g Guarantees, overrideKey, declare string) (msg, hint string) {
	d.mu.Lock()
	settle := d.settle
	d.settle = nil
	d.mu.Unlock()
	if settle != nil {
		settle()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.keys) == 0 && len(d.files) == 0 {
		return "", ""
	}
	var what, how []string
	told := map[string][]string{}
	var tellers []string
	for _, k := range d.keys {
		thing := map[Key]string{NoNetwork: "a socket", NoSubprocess: "a new process"}[k]
		what = append(what, fmt.Sprintf("%s (%s, set by %s)", thing, k, g.From[k]))
		switch g.From[k] {
		case FromOverride:
			how = append(how, fmt.Sprintf("remove %s = true from [capability_overrides.%q]", k, overrideKey))
		case FromPack:
			// A command's own declaration cannot loosen its pack's.
			how = append(how, fmt.Sprintf("declare %s in the pack's top-level capabilities in its extension.yaml (they hold for every command of the pack)", allowWith[k]))
		case FromTrust:
			how = append(how, fmt.Sprintf("[trust] allowed_capabilities withholds %s from every tool", k.Capability()))
		default:
			how = append(how, fmt.Sprintf("declare %s in %s", allowWith[k], declare))
		}
	}
	for _, f := range d.named() {
		w, h := d.explainFile(g, f, overrideKey, declare)
		if f.Reported() {
			if told[f.From] == nil {
				tellers = append(tellers, f.From)
			}
			told[f.From] = append(told[f.From], w)
		} else {
			what = append(what, w)
		}
		how = append(how, h)
	}
	var parts []string
	if len(what) > 0 {
		parts = append(parts, "the kernel refused it "+strings.Join(what, " and "))
	}
	for _, from := range tellers {
		// The tool's word, checked against capgate's rules: never
		// presented as the kernel's.
		parts = append(parts, from+" reports a refused access to "+strings.Join(told[from], " and ")+
			" (capgate cannot read the kernel's audit records here; the path was checked against its sandbox rules)")
	}
	return strings.Join(parts, "; "), strings.Join(slices.Compact(how), "; ")
}

// explainFile names a refused file access and what would allow it.
func (d *Denials) explainFile(g Guarantees, f FileDenial, overrideKey, declare string) (what, how string) {
	write := !strings.Contains(f.Blockers, "fs.read_") && f.Blockers != "fs.execute" && f.Blockers != reportedRead
	access := "reading"
	if write {
		access = "writing"
	}
	what = fmt.Sprintf("%s %s (%s)", access, f.Path, f.Blockers)
	switch f.Blockers {
	case reportedRead:
		what = fmt.Sprintf("%s, which its sandbox does not let it read", f.Path)
	case reportedWrite:
		what = fmt.Sprintf("%s, which its sandbox lets it read but not write", f.Path)
	}
	if slices.ContainsFunc(d.deny, func(p string) bool { return under(f.Path, p) }) {
		return what, "it is capgate's own (its data dir, config or key files): no declaration opens it"
	}
	key := NoFilesystemRead
	if write {
		key = NoFilesystemWrite
	}
	dir := filepath.Dir(f.Path)
	switch from := g.From[key]; {
	case from == FromOverride:
		return what, fmt.Sprintf("remove %s = true from [capability_overrides.%q]", key, overrideKey)
	case from == FromTrust:
		return what, fmt.Sprintf("[trust] allowed_capabilities withholds %s from every tool", key.Capability())
	case from == FromPack:
		return what, "the pack's top-level capabilities in its extension.yaml withhold it from every command of the pack"
	case write && g.Has(NoFilesystemWrite):
		return what, fmt.Sprintf("declare filesystem: write with write_paths: [%q] in %s", dir, declare)
	case write:
		return what, fmt.Sprintf("add %q to write_paths in %s", dir, declare)
	case g.Has(NoFilesystemRead):
		return what, fmt.Sprintf("declare filesystem: read with read_paths: [%q] in %s", dir, declare)
	default:
		return what, fmt.Sprintf("add %q to read_paths in %s", dir, declare)
	}
}
