package registry

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/capgate/capgate/tool"
)

// LockFile is the default name of the definition pins.
const LockFile = "capgate.lock"

// Lock pins tool definitions, like go.sum: one line per tool id with a
// hash of what the model is told about it.
type Lock struct {
	Pins map[string]string // tool id → "sha256:<hex>"
}

// DefinitionHash hashes what a tool says about itself: its source's name,
// description, schemas and annotations, as the source gave them (before
// operator overrides), so an upstream that quietly changes its tool is
// noticed.
func DefinitionHash(d *tool.Descriptor) string {
	b, _ := json.Marshal(struct {
		Name         string           `json:"name"`
		Title        string           `json:"title,omitempty"`
		Description  string           `json:"description"`
		InputSchema  json.RawMessage  `json:"input_schema,omitempty"`
		OutputSchema json.RawMessage  `json:"output_schema,omitempty"`
		Annotations  tool.Annotations `json:"annotations"`
	}{d.Name, d.Title, d.Description, compact(d.InputSchema), compact(d.OutputSchema), d.Annotations})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
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
	return l, sc.Err()
}

// WriteLock pins every tool of the snapshot.
func WriteLock(path string, tools []*tool.Descriptor) error {
	var b strings.Builder
	b.WriteString("# capgate.lock: tool definition pins, written by `capgate tools lock`.\n")
	b.WriteString("# A tool whose definition no longer matches its pin is quarantined.\n")
	lines := make([]string, 0, len(tools))
	for _, d := range tools {
		lines = append(lines, d.ID+" "+d.DefinitionHash)
	}
	slices.Sort(lines)
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
