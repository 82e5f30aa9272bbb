// Package ext is the extension-pack tool source: a directory per pack with
// an extension.yaml, each command run as a subprocess that reads the JSON
// input on stdin and writes one JSON result on stdout.
package ext

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// ManifestFile is the name of a pack's manifest.
const ManifestFile = "extension.yaml"

// Manifest is extension.yaml.
type Manifest struct {
	ID          string             `yaml:"id"`
	Name        string             `yaml:"name"`
	Description string             `yaml:"description"`
	Permissions []string           `yaml:"permissions"`
	Commands    map[string]Command `yaml:"commands"`
	// Capabilities declares what every command of the pack is limited to
	// (filesystem, network, env, subprocess), as namel3ss packs declare it
	// for a whole pack; each command's own declaration narrows it further,
	// never loosens it. The guarantees it makes are from "pack".
	Capabilities map[string]any `yaml:"capabilities"`
}

// Command is one tool of a pack.
type Command struct {
	Description  string   `yaml:"description"`
	Run          []string `yaml:"run"` // argv; a path is relative to the pack
	InputSchema  any      `yaml:"input_schema"`
	OutputSchema any      `yaml:"output_schema"`
	Risk         string   `yaml:"risk"`         // LOW, MED, HIGH, CRITICAL
	SideEffects  []string `yaml:"side_effects"` // nil: not declared
	Mutating     bool     `yaml:"mutating"`
	Timeout      string   `yaml:"timeout"` // overrides the source's, e.g. "5s"
	// Capabilities declares what the command needs (filesystem, network,
	// env, subprocess, secrets); what it leaves out, it is denied.
	Capabilities map[string]any `yaml:"capabilities"`
	// Purity "pure" says the command needs nothing: every guarantee.
	Purity string `yaml:"purity"`
}

// Options bound every call of every pack.
type Options struct {
	Timeout   time.Duration // default 30s
	MaxOutput int64         // stdout cap in bytes; default 1 MiB
	// Env names host variables passed through beyond proc.BaseEnv.
	Env []string
	// LookupEnv reads the host environment; default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Policy is the operator's overrides (by tool id), trust ceiling and
	// deny paths, applied to each command's declared capabilities.
	Policy sandbox.Policy
	// Logger receives the stderr tails of failing commands, which are
	// never returned to a caller; default discards.
	Logger *slog.Logger
}

var (
	packIDRe  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	commandRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
)

// CapabilitiesFile is where namel3ss packs declare guarantees.
const CapabilitiesFile = "capabilities.yaml"

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// Pack is one loaded extension pack; it is a tool.Source.
type Pack struct {
	Dir      string
	Manifest Manifest
	opts     Options
	tools    []*tool.Descriptor
	timeouts map[string]time.Duration
	confine  map[string]sandbox.Confinement // by command name
}

var _ tool.Source = (*Pack)(nil)

// Discover loads every pack under each path (one directory per pack). It
// reports every bad manifest, and two packs with one id, in one error.
func Discover(paths []string, opts Options) ([]*Pack, error) {
	var packs []*Pack
	var errs []error
	seen := map[string]string{}
	for _, root := range paths {
		entries, err := os.ReadDir(root)
		if err != nil {
			errs = append(errs, fmt.Errorf("extensions: %w", err))
			continue
		}
		for _, e := range entries {
			dir := filepath.Join(root, e.Name())
			if !e.IsDir() {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, ManifestFile)); errors.Is(err, os.ErrNotExist) {
				continue // not a pack
			}
			p, err := Load(dir, opts)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if other, ok := seen[p.ID()]; ok {
				errs = append(errs, fmt.Errorf("%s: id %q is also the id of %s", filepath.Join(dir, ManifestFile), p.ID(), other))
				continue
			}
			seen[p.ID()] = filepath.Join(dir, ManifestFile)
			packs = append(packs, p)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return packs, nil
}

// Load reads the pack in dir.
func Load(dir string, opts Options) (*Pack, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = 1 << 20
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	// Commands run in the pack's directory, so it must not depend on ours.
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, ManifestFile)
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	// A namel3ss pack declares its guarantees in capabilities.yaml, which
	// capgate does not read: refused, never ignored, so that no author
	// believes guarantees hold that nothing enforces.
	if other := filepath.Join(dir, CapabilitiesFile); exists(other) {
		return nil, fmt.Errorf("%s: capgate does not read this file, so its guarantees would not hold: move each command's declaration to commands.NAME.capabilities in %s (filesystem, network, env, subprocess, secrets) and remove it", other, file)
	}
	var m Manifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, yamlError(file, err)
	}
	p := &Pack{Dir: dir, Manifest: m, opts: opts, timeouts: map[string]time.Duration{},
		confine: map[string]sandbox.Confinement{}}
	if err := p.build(file); err != nil {
		return nil, err
	}
	return p, nil
}

var (
	yamlLine = regexp.MustCompile(`line (\d+): (.*)`)
	yamlType = regexp.MustCompile(` not found in type \S+`)
)

// yamlError rewrites yaml.v3's "line N: ..." errors as "file:N: ...".
func yamlError(file string, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var errs []error
		for _, e := range te.Errors {
			if m := yamlLine.FindStringSubmatch(e); m != nil {
				msg := strings.Replace(m[2], "field ", "unknown key ", 1)
				msg = yamlType.ReplaceAllString(msg, "")
				errs = append(errs, fmt.Errorf("%s:%s: %s", file, m[1], msg))
			} else {
				errs = append(errs, fmt.Errorf("%s: %s", file, e))
			}
		}
		return errors.Join(errs...)
	}
	return fmt.Errorf("%s: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
}

func (p *Pack) build(file string) error {
	m := &p.Manifest
	var errs []error
	fail := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", file, key, fmt.Sprintf(format, args...)))
	}
	if !packIDRe.MatchString(m.ID) {
		fail("id", "%q must match ^[a-z0-9][a-z0-9._-]*$", m.ID)
	}
	if len(m.Commands) == 0 {
		fail("commands", "required: a pack offers at least one command")
	}
	var pack *sandbox.Declared
	if m.Capabilities != nil {
		d, err := sandbox.ParseDeclared(m.Capabilities, "capabilities")
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", file, err))
		case d.Secrets != nil:
			// Secrets are each command's to need: a pack-wide list would
			// hand every command every secret.
			fail("capabilities.secrets", "declare secrets per command, in commands.NAME.capabilities.secrets")
		default:
			pack = &d
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Commands)) {
		c := m.Commands[name]
		key := "commands." + name
		if !commandRe.MatchString(name) {
			fail(key, "command name %q may hold only letters, digits, _ . and -", name)
		}
		if len(c.Run) == 0 || c.Run[0] == "" {
			fail(key+".run", "required: the argv to start, for example [\"./bin/get\"]")
		}
		in, err := schemaJSON(c.InputSchema, `{"type":"object"}`)
		if err != nil {
			fail(key+".input_schema", "%v", err)
		}
		out, err := schemaJSON(c.OutputSchema, "")
		if err != nil {
			fail(key+".output_schema", "%v", err)
		}
		if c.Timeout != "" {
			d, err := time.ParseDuration(c.Timeout)
			if err != nil || d <= 0 {
				fail(key+".timeout", "%q is not a positive duration such as \"5s\"", c.Timeout)
			}
			p.timeouts[name] = d
		}
		var declared risk.Declaration
		if c.Risk != "" {
			if declared.Level, err = risk.ParseLevel(c.Risk); err != nil {
				fail(key+".risk", "%v", err)
			}
		}
		if c.SideEffects != nil {
			if declared.Effects, err = risk.ParseSideEffects(c.SideEffects); err != nil {
				fail(key, "%v", err)
			}
		}
		id := tool.ID(tool.KindExt, m.ID, name)
		decl, err := sandbox.ParseDeclared(c.Capabilities, key+".capabilities")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", file, err))
		}
		switch c.Purity {
		case "":
		case "pure":
			if c.Capabilities != nil {
				fail(key+".purity", "pure guarantees everything; drop capabilities or purity")
			}
			decl.Pure = true
		default:
			fail(key+".purity", "%q is not pure (the one purity there is)", c.Purity)
		}
		decl.Pack = pack
		conf, notes := p.opts.Policy.For(id, decl, p.Dir)
		for _, n := range notes {
			p.opts.Logger.Warn("capability override ignored", "tool", id, "note", n)
		}
		p.confine[name] = conf
		if err := conf.Unreachable(c.Run, p.Dir); err != nil {
			p.opts.Logger.Warn("extension command unreachable by the user tools run as: its calls will fail", "tool", id, "err", err)
		}
		d := &tool.Descriptor{
			ID:           id,
			Kind:         tool.KindExt,
			Source:       m.ID,
			Name:         name,
			Description:  c.Description,
			InputSchema:  in,
			OutputSchema: out,
			Risk: risk.Assess(risk.Declaration{}, declared, risk.Hints{
				Name: name, Description: c.Description, Permissions: m.Permissions,
			}),
			Mutating:   c.Mutating,
			Available:  true,
			Guarantees: conf.Describe(),
			Launch:     conf.Launch(c.Run, p.Dir).JSON(),
		}
		p.tools = append(p.tools, d)
	}
	return errors.Join(errs...)
}

// schemaJSON turns a YAML schema into JSON; a schema must be an object.
func schemaJSON(v any, def string) (json.RawMessage, error) {
	if v == nil {
		if def == "" {
			return nil, nil
		}
		return json.RawMessage(def), nil
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, errors.New("must be a JSON Schema object")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Hold checks each command's launch at every start against what pins
// gives for its name (capgate.lock's launches, sandbox.Hold); log is told
// of each start refused. Call it before the pack serves.
func (p *Pack) Hold(pins func(name string) []sandbox.Launch, log func(string, ...any)) {
	for name, conf := range p.confine {
		conf.Held = sandbox.Hold(tool.ID(tool.KindExt, p.Manifest.ID, name), p.Manifest.Commands[name].Run, p.Dir, log, pins(name)...)
		p.confine[name] = conf
	}
}

// ID is the pack id.
func (p *Pack) ID() string { return p.Manifest.ID }

// Kind is tool.KindExt.
func (p *Pack) Kind() tool.Kind { return tool.KindExt }

// List returns copies of the pack's tools.
func (p *Pack) List(context.Context) ([]*tool.Descriptor, error) {
	out := make([]*tool.Descriptor, len(p.tools))
	for i, d := range p.tools {
		out[i] = d.Clone()
	}
	return out, nil
}

// Call runs the command, bounded by its timeout and the output cap.
func (p *Pack) Call(ctx context.Context, c tool.Call) (*tool.Result, error) {
	if c.Tool == nil || c.Tool.Kind != tool.KindExt || c.Tool.Source != p.ID() {
		return nil, tool.Errorf(tool.CodeNotFound, "no such tool in pack %s", p.ID())
	}
	cmdSpec, ok := p.Manifest.Commands[c.Tool.Name]
	if !ok {
		return nil, tool.Errorf(tool.CodeNotFound, "pack %s has no command %s", p.ID(), c.Tool.Name)
	}
	timeout := p.opts.Timeout
	if t, ok := p.timeouts[c.Tool.Name]; ok {
		timeout = t
	}
	argv := slices.Clone(cmdSpec.Run)
	if strings.ContainsRune(argv[0], '/') && !filepath.IsAbs(argv[0]) {
		argv[0] = filepath.Join(p.Dir, argv[0])
	}
	input := c.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	var denials sandbox.Denials
	conf := p.confine[c.Tool.Name].ObservedBy(denials.Observe(c.Denied))
	conf.Files = &denials
	out, stderr, err := proc.Run(ctx, proc.Spec{
		Argv: argv, Dir: p.Dir, Env: proc.Env(p.opts.LookupEnv, p.opts.Env),
		Stdin: input, Timeout: timeout, MaxOutput: p.opts.MaxOutput, Launcher: conf,
		Protocol: c.SecretsEnv(),
	})
	id := c.Tool.ID
	if err != nil && stderr != "" {
		// The tail goes to the operator, never to the caller: a command
		// may print what it must not return.
		p.opts.Logger.Warn("extension command failed", "tool", id, "err", err, "stderr", stderr)
	}
	var exit *proc.ExitError
	var unenforceable *sandbox.UnenforceableError
	var changed *sandbox.ChangedError
	switch {
	case err == nil:
		return parseOutput(id, out)
	case errors.As(err, &changed):
		return nil, changed.Refusal()
	case errors.As(err, &unenforceable):
		return nil, sandbox.Refusal(err, id, "%s not run: %v", id, err)
	case errors.Is(err, proc.ErrTimeout):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s timed out after %s", id, timeout)
	case errors.Is(err, proc.ErrCancelled):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s was cancelled", id)
	case errors.Is(err, proc.ErrOutputTooLarge):
		e := tool.Errorf(tool.CodeInvalidOutput, "%s: the output exceeds the limit of %d bytes for extensions", id, p.opts.MaxOutput)
		e.Hint = "extensions.max_output_bytes in capgate.toml sets the limit"
		return nil, e
	case errors.As(err, &exit) && sandbox.StartFailed(exit.Status, stderr):
		// The launcher's own refusal, before the tool ran: what it says
		// (a path run_as cannot enter, a rule the kernel refused) is
		// capgate's, so the caller sees it, bounded and scrubbed.
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s could not start in its sandbox: %s", id, proc.Reported(stderr))
	case errors.As(err, &exit):
		e := tool.Wrap(err, tool.CodeBackendUnavailable, "%s exited with status %d (its stderr is in capgate's log)", id, exit.Status)
		denials.Stderr(stderr) // where capgate reads no audit: the refusals its stderr reports
		if msg, hint := denials.Explain(conf.Guarantees, id, fmt.Sprintf("commands.%s.capabilities of %s", c.Tool.Name, filepath.Join(p.Dir, ManifestFile))); msg != "" {
			e.Message += "; " + msg
			e.Hint = hint
		}
		return nil, e
	default:
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "%s %v", id, err)
	}
}

// parseOutput reads the one JSON value a command wrote. An object with a
// "content" array is an MCP result as is; any other value is the tool's
// structured output, also given as text.
func parseOutput(id string, out []byte) (*tool.Result, error) {
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		if err == io.EOF {
			return nil, tool.Errorf(tool.CodeInvalidOutput, "%s wrote no output; want one JSON value", id)
		}
		return nil, tool.Wrap(err, tool.CodeInvalidOutput, "%s wrote invalid JSON: %v", id, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, tool.Errorf(tool.CodeInvalidOutput, "%s wrote more than one JSON value", id)
	}
	var asResult struct {
		Content    []json.RawMessage `json:"content"`
		Structured json.RawMessage   `json:"structuredContent"`
		IsError    bool              `json:"isError"`
	}
	if bytes.HasPrefix(bytes.TrimSpace(v), []byte("{")) {
		if err := json.Unmarshal(v, &asResult); err == nil && asResult.Content != nil {
			return &tool.Result{Content: asResult.Content, Structured: asResult.Structured, IsError: asResult.IsError}, nil
		}
	}
	r := tool.TextResult(string(bytes.TrimSpace(v)))
	if bytes.HasPrefix(bytes.TrimSpace(v), []byte("{")) {
		r.Structured = v
	}
	return r, nil
}
