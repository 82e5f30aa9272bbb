// Package bridge is the tool source for Ash's bridge-v1 command providers:
// one process per request, a JSON request envelope on stdin, one response
// envelope on stdout, validated as Ash validates it.
package bridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/internal/proc"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// ProtocolVersion is the bridge protocol spoken.
const ProtocolVersion = 1

var (
	namespaceRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	capabilityIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*\.[a-z0-9][a-z0-9_-]*$`)
)

// Options configure one provider.
type Options struct {
	Namespace string
	Command   []string
	Timeout   time.Duration // default 30s
	// Secret is this provider's own context-token key (derived from
	// capgate's, never capgate's itself), given to it as
	// ASH_CONTEXT_TOKEN_SECRET (base64url, unpadded) so it can verify the
	// token that comes with each request.
	Secret    []byte
	Env       []string // host variables passed through beyond proc.BaseEnv
	LookupEnv func(string) (string, bool)
	MaxOutput int64 // default 4 MiB
	// Confine is what the provider's process guarantees (its whole
	// process's declaration); the zero value, nothing.
	Confine sandbox.Confinement
	// Logger receives the stderr tails of failing commands, which are
	// never returned to a caller; default discards.
	Logger *slog.Logger
}

// Provider is one bridge; it is a tool.Source and a tool.Authenticator.
type Provider struct {
	opts Options
	// tokenEnv is Secret as the provider receives it, encoded once.
	tokenEnv string
	mu       sync.RWMutex
	ops      map[string]operation // by tool name, from the last good definitions
	launch   json.RawMessage      // its pin (sandbox.Launch)
}

type operation struct {
	capabilityID string
	name         string
}

var (
	_ tool.Source        = (*Provider)(nil)
	_ tool.Authenticator = (*Provider)(nil)
)

// New checks the options; it does not start the provider.
func New(opts Options) (*Provider, error) {
	if !namespaceRe.MatchString(opts.Namespace) {
		return nil, fmt.Errorf("bridge namespace %q must match ^[a-z0-9][a-z0-9_-]*$", opts.Namespace)
	}
	if len(opts.Command) == 0 || opts.Command[0] == "" {
		return nil, fmt.Errorf("bridge %s: command is empty", opts.Namespace)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = 4 << 20
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Provider{opts: opts, ops: map[string]operation{},
		tokenEnv: "ASH_CONTEXT_TOKEN_SECRET=" + base64.RawURLEncoding.EncodeToString(opts.Secret),
		// Pinned by capgate.lock with each of its tools: the program as it
		// is when the source is built (at start and at each reload).
		launch: opts.Confine.Launch(opts.Command, "").JSON()}, nil
}

func (p *Provider) ID() string { return p.opts.Namespace }

// Launch is what capgate.lock pins of the provider's process
// (sandbox.Launch).
func (p *Provider) Launch() json.RawMessage { return p.launch }
func (p *Provider) Kind() tool.Kind         { return tool.KindBridge }

// request is the envelope, fields in Ash's order.
type request struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Method    string `json:"method"`
	Params    any    `json:"params"`
}

func (p *Provider) invalid(format string, args ...any) *tool.Error {
	return tool.Errorf(tool.CodeInvalidOutput, "bridge %s: "+format, append([]any{p.opts.Namespace}, args...)...)
}

// call runs one request and returns the validated result object.
// c, for an invoke, brings a skill's secrets and the observer of denials.
func (p *Provider) call(ctx context.Context, method string, params any, c *tool.Call) (json.RawMessage, error) {
	var secrets []string
	var denials sandbox.Denials
	conf := p.opts.Confine
	if c != nil {
		secrets = c.SecretsEnv()
		conf = conf.ObservedBy(denials.Observe(c.Denied))
		conf.Files = &denials
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	id := "cap_bridge_" + hex.EncodeToString(idb[:])
	in, err := json.Marshal(request{ProtocolVersion, id, p.opts.Namespace, method, params})
	if err != nil {
		return nil, err
	}
	out, stderr, err := proc.Run(ctx, proc.Spec{Argv: p.opts.Command, Env: proc.Env(p.opts.LookupEnv, p.opts.Env),
		Protocol: append(secrets, p.tokenEnv),
		Stdin:    in, Timeout: p.opts.Timeout, MaxOutput: p.opts.MaxOutput, Launcher: conf})
	ns := p.opts.Namespace
	if err != nil && stderr != "" {
		// The tail goes to the operator, never to the caller: a provider
		// may print what it must not return.
		p.opts.Logger.Warn("bridge command failed", "bridge", ns, "method", method, "err", err, "stderr", stderr)
	}
	var exit *proc.ExitError
	var start *proc.StartError
	var unenforceable *sandbox.UnenforceableError
	var changed *sandbox.ChangedError
	switch {
	case err == nil:
	case errors.As(err, &changed):
		return nil, changed.Refusal()
	case errors.As(err, &unenforceable):
		return nil, sandbox.Refusal(err, "bridge:"+ns, "bridge %s: not run: %v", ns, err)
	case errors.Is(err, proc.ErrTimeout):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: %s timed out after %s", ns, method, p.opts.Timeout)
	case errors.Is(err, proc.ErrCancelled):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: %s was cancelled", ns, method)
	case errors.Is(err, proc.ErrOutputTooLarge):
		e := p.invalid("%s: the answer exceeds the limit of %d bytes for bridge providers", method, p.opts.MaxOutput)
		e.Hint = "capabilities.max_output_bytes in capgate.toml sets the limit"
		return nil, e
	case errors.As(err, &exit) && sandbox.StartFailed(exit.Status, stderr):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: could not start in its sandbox: %s", ns, proc.Reported(stderr))
	case errors.As(err, &exit):
		e := tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: command failed with exit %d (its stderr is in capgate's log)", ns, exit.Status)
		denials.Stderr(stderr) // where capgate reads no audit: the refusals its stderr reports
		// What the kernel refused it during this call, and what would
		// allow it, as for an extension command.
		if msg, hint := denials.Explain(conf.Guarantees, "bridge:"+ns, fmt.Sprintf("capabilities of [capabilities.providers.%s]", ns)); msg != "" {
			e.Message += "; " + msg
			e.Hint = hint
		}
		return nil, e
	case errors.As(err, &start):
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: command not found: %s", ns, p.opts.Command[0])
	default:
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "bridge %s: %v", ns, err)
	}
	return p.parseResponse(id, out)
}

// parseResponse applies the bridge-v1 rules in Ash's order; every
// violation is capability_invalid_output, and a valid error envelope keeps
// the provider's own code.
func (p *Provider) parseResponse(id string, out []byte) (json.RawMessage, error) {
	if !json.Valid(out) {
		return nil, p.invalid("command returned invalid JSON")
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(out, &env); err != nil || env == nil {
		return nil, p.invalid("command returned non-object JSON")
	}
	if string(bytes.TrimSpace(env["version"])) != "1" {
		return nil, p.invalid("response version mismatch: want 1")
	}
	var gotID string
	if err := json.Unmarshal(env["id"], &gotID); err != nil || strings.TrimSpace(gotID) != id {
		return nil, p.invalid("response id mismatch")
	}
	res, hasRes := env["result"]
	errRaw, hasErr := env["error"]
	if hasRes == hasErr {
		return nil, p.invalid("response must contain exactly one of result or error")
	}
	if hasErr {
		var e map[string]any
		if err := json.Unmarshal(errRaw, &e); err != nil || e == nil {
			return nil, p.invalid("error payload must be an object")
		}
		code, _ := e["code"].(string)
		msg, _ := e["message"].(string)
		if strings.TrimSpace(code) == "" {
			return nil, p.invalid("error.code is required")
		}
		if strings.TrimSpace(msg) == "" {
			return nil, p.invalid("error.message is required")
		}
		// The provider's own message, unless it carries a credential.
		if err := harden.CheckMessage("bridge "+p.opts.Namespace, msg); err != nil {
			return nil, err
		}
		return nil, &tool.Error{Code: tool.Code(strings.TrimSpace(code)), Message: strings.TrimSpace(msg)}
	}
	if !bytes.HasPrefix(bytes.TrimSpace(res), []byte("{")) {
		return nil, p.invalid("result must be an object")
	}
	return res, nil
}

// definition is one entry of the definitions answer.
type definition struct {
	ID               string          `json:"id"`
	Description      string          `json:"description"`
	Sensitive        *bool           `json:"sensitive"`
	AllowedChatTypes []string        `json:"allowed_chat_types"`
	Operations       json.RawMessage `json:"operations"`
}

type opDef struct {
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	RequiresAuth *bool           `json:"requires_auth"`
	Mutating     bool            `json:"mutating"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema"`
}

// List asks the provider for its definitions. Any invalid, foreign or
// duplicate capability fails the whole list, and the previous definitions
// stay: no partial state.
func (p *Provider) List(ctx context.Context) ([]*tool.Descriptor, error) {
	res, err := p.call(ctx, "definitions", map[string]any{}, nil)
	if err != nil {
		return nil, err
	}
	var body struct {
		Definitions []json.RawMessage `json:"definitions"`
	}
	if err := json.Unmarshal(res, &body); err != nil || body.Definitions == nil {
		return nil, p.invalid("definitions response must include a definitions array")
	}
	ns := p.opts.Namespace
	guarantees := p.opts.Confine.Describe() // one process serves every operation
	var tools []*tool.Descriptor
	ops := map[string]operation{}
	seen := map[string]bool{}
	for i, raw := range body.Definitions {
		var d definition
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, p.invalid("definitions[%d]: %v", i, err)
		}
		d.ID, d.Description = strings.TrimSpace(d.ID), strings.TrimSpace(d.Description)
		switch {
		case d.ID == "" || d.Description == "":
			return nil, p.invalid("definitions[%d]: id and description are required", i)
		case !capabilityIDRe.MatchString(d.ID):
			return nil, p.invalid("capability id %q must match ^[a-z0-9][a-z0-9_-]*\\.[a-z0-9][a-z0-9_-]*$", d.ID)
		case !strings.HasPrefix(d.ID, ns+"."):
			return nil, p.invalid("capability %q is outside the provider's namespace %q", d.ID, ns)
		case seen[d.ID]:
			return nil, p.invalid("capability %q is defined twice", d.ID)
		}
		seen[d.ID] = true
		opList, err := p.operations(d)
		if err != nil {
			return nil, err
		}
		sensitive := d.Sensitive != nil && *d.Sensitive
		chats := normalizeChatTypes(d.AllowedChatTypes)
		if sensitive && len(chats) == 0 {
			chats = []string{"private"} // sensitive with no list: private only
		}
		for _, op := range opList {
			name := strings.TrimPrefix(d.ID, ns+".") + "." + op.Name
			requiresAuth := op.RequiresAuth == nil || *op.RequiresAuth
			tools = append(tools, &tool.Descriptor{
				ID:               tool.ID(tool.KindBridge, ns, name),
				Kind:             tool.KindBridge,
				Source:           ns,
				Name:             name,
				Title:            d.Description,
				Description:      op.Description,
				InputSchema:      op.InputSchema,
				OutputSchema:     op.OutputSchema,
				Risk:             risk.Assess(risk.Declaration{}, risk.Declaration{}, risk.Hints{Name: name, Description: op.Description}),
				Sensitive:        sensitive,
				AllowedChatTypes: chats,
				Mutating:         op.Mutating,
				RequiresAuth:     requiresAuth,
				Available:        true,
				Guarantees:       guarantees.Clone(),
				Launch:           p.launch,
			})
			ops[name] = operation{capabilityID: d.ID, name: op.Name}
		}
	}
	p.mu.Lock()
	p.ops = ops
	p.mu.Unlock()
	return tools, nil
}

// operations reads a definition's operations, a list or a map by name.
func (p *Provider) operations(d definition) ([]opDef, error) {
	var list []opDef
	var asMap map[string]opDef
	switch {
	case json.Unmarshal(d.Operations, &list) == nil && list != nil:
	case json.Unmarshal(d.Operations, &asMap) == nil && asMap != nil:
		for _, key := range slices.Sorted(maps.Keys(asMap)) {
			op := asMap[key]
			if strings.TrimSpace(op.Name) == "" {
				op.Name = key
			}
			if strings.TrimSpace(op.Name) != strings.TrimSpace(key) {
				return nil, p.invalid("capability %q: operation key %q does not match its name %q", d.ID, key, op.Name)
			}
			list = append(list, op)
		}
	default:
		return nil, p.invalid("capability %q: operations must be a list or a map", d.ID)
	}
	if len(list) == 0 {
		return nil, p.invalid("capability %q has no operations", d.ID)
	}
	names := map[string]bool{}
	for i := range list {
		op := &list[i]
		op.Name, op.Description = strings.TrimSpace(op.Name), strings.TrimSpace(op.Description)
		if op.Name == "" || op.Description == "" {
			return nil, p.invalid("capability %q: operations need a name and a description", d.ID)
		}
		if names[op.Name] {
			return nil, p.invalid("capability %q: operation %q is defined twice", d.ID, op.Name)
		}
		names[op.Name] = true
		for _, s := range []*json.RawMessage{&op.InputSchema, &op.OutputSchema} {
			if len(*s) > 0 && !bytes.HasPrefix(bytes.TrimSpace(*s), []byte("{")) {
				return nil, p.invalid("capability %q operation %q: schemas must be objects", d.ID, op.Name)
			}
		}
		if len(op.InputSchema) == 0 {
			op.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
	}
	return list, nil
}

// normalizeChatTypes lowercases, de-duplicates and sorts chat types.
func normalizeChatTypes(in []string) []string {
	var out []string
	for _, c := range in {
		c = strings.ToLower(strings.TrimSpace(c))
		if c != "" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// Call invokes one operation. The result's "output" object is the tool's
// output when present; otherwise the whole result is.
func (p *Provider) Call(ctx context.Context, c tool.Call) (*tool.Result, error) {
	if c.Tool == nil || c.Tool.Kind != tool.KindBridge || c.Tool.Source != p.opts.Namespace {
		return nil, tool.Errorf(tool.CodeNotFound, "no such tool in bridge %s", p.opts.Namespace)
	}
	p.mu.RLock()
	op, ok := p.ops[c.Tool.Name]
	p.mu.RUnlock()
	if !ok {
		return nil, tool.Errorf(tool.CodeNotFound, "bridge %s has no operation %s", p.opts.Namespace, c.Tool.Name)
	}
	input := c.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	params := struct {
		CapabilityID   string          `json:"capability_id"`
		Operation      string          `json:"operation"`
		InputData      json.RawMessage `json:"input_data"`
		AccountRef     *string         `json:"account_ref"`
		IdempotencyKey *string         `json:"idempotency_key"`
		ContextToken   string          `json:"context_token"`
	}{op.capabilityID, op.name, input, nullable(c.Account), nullable(c.IdempotencyKey), c.ContextToken}
	res, err := p.call(ctx, "invoke", params, &c)
	if err != nil {
		return nil, err
	}
	var body struct {
		Output json.RawMessage `json:"output"`
	}
	out := res
	if json.Unmarshal(res, &body) == nil && bytes.HasPrefix(bytes.TrimSpace(body.Output), []byte("{")) {
		out = body.Output
	}
	r := tool.TextResult(string(out))
	r.Structured = out
	return r, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// AuthBegin starts an auth flow for a capability; the provider must answer
// an auth_url.
func (p *Provider) AuthBegin(ctx context.Context, capabilityID, accountHint, contextToken string) (*tool.AuthBegin, error) {
	res, err := p.call(ctx, "auth_begin", map[string]any{
		"capability_id": capabilityID, "account_hint": nullable(accountHint), "context_token": contextToken,
	}, nil)
	if err != nil {
		return nil, err
	}
	var body struct {
		AuthURL string `json:"auth_url"`
	}
	if json.Unmarshal(res, &body) != nil || strings.TrimSpace(body.AuthURL) == "" {
		return nil, p.invalid("auth_begin must return auth_url")
	}
	return &tool.AuthBegin{AuthURL: body.AuthURL, Raw: res}, nil
}

// AuthComplete finishes a flow; params are the bridge's auth_complete
// params (flow_state, authorization_code, ...) without the token.
func (p *Provider) AuthComplete(ctx context.Context, capabilityID string, params json.RawMessage, contextToken string) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(params, &m); err != nil || m == nil {
		return nil, tool.Errorf(tool.CodeAuthFlowInvalid, "auth_complete params must be an object")
	}
	m["capability_id"], m["context_token"] = capabilityID, contextToken
	res, err := p.call(ctx, "auth_complete", m, nil)
	if err != nil {
		return nil, err
	}
	var body struct {
		AccountRef string `json:"account_ref"`
	}
	if json.Unmarshal(res, &body) != nil || strings.TrimSpace(body.AccountRef) == "" {
		return nil, p.invalid("auth_complete must return account_ref")
	}
	return res, nil
}
