package tool

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capgate/capgate/risk"
)

// Kind is the kind of source a tool comes from.
type Kind string

const (
	KindExt    Kind = "ext"    // extension packs, run as subprocesses
	KindBridge Kind = "bridge" // bridge-v1 command providers
	KindMCP    Kind = "mcp"    // upstream MCP servers
)

// Kinds lists the source kinds.
var Kinds = []Kind{KindExt, KindBridge, KindMCP}

// ParseKind reads a source kind.
func ParseKind(s string) (Kind, error) {
	k := Kind(s)
	if slices.Contains(Kinds, k) {
		return k, nil
	}
	return "", fmt.Errorf("unknown source kind %q: valid kinds are ext, bridge, mcp", s)
}

// ID builds a tool id: <kind>:<source>:<name>.
func ID(kind Kind, source, name string) string {
	return string(kind) + ":" + source + ":" + name
}

// ParseID splits a tool id into its kind, source and name. The name may
// itself contain ':'.
func ParseID(id string) (Kind, string, string, error) {
	k, rest, ok := strings.Cut(id, ":")
	if !ok {
		return "", "", "", fmt.Errorf("tool id %q: want <kind>:<source>:<name>", id)
	}
	kind, err := ParseKind(k)
	if err != nil {
		return "", "", "", fmt.Errorf("tool id %q: %w", id, err)
	}
	source, name, ok := strings.Cut(rest, ":")
	if !ok || source == "" || name == "" {
		return "", "", "", fmt.Errorf("tool id %q: want <kind>:<source>:<name>", id)
	}
	return kind, source, name, nil
}

// exposedName is what many MCP clients accept as a tool name.
// Compiled on first use: its {1,64} makes it ~1 ms of every capgate
// start's package inits otherwise, the sandbox trampoline's included.
var exposedName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`) })

// ValidExposedName reports whether name is acceptable to MCP clients.
func ValidExposedName(name string) bool { return exposedName().MatchString(name) }

// Annotations are the MCP tool annotations. Nil means the tool did not say.
type Annotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    *bool  `json:"readOnlyHint,omitempty"`
	DestructiveHint *bool  `json:"destructiveHint,omitempty"`
	IdempotentHint  *bool  `json:"idempotentHint,omitempty"`
	OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
}

// Descriptor is one tool of the catalog.
type Descriptor struct {
	ID          string `json:"id"`           // <kind>:<source>:<name>
	Kind        Kind   `json:"kind"`         // source kind
	Source      string `json:"source"`       // source id within its kind
	Name        string `json:"name"`         // the source's own name for it
	ExposedName string `json:"exposed_name"` // the name MCP clients see
	Title       string `json:"title,omitempty"`
	Description string `json:"description"`
	// Schemas are kept byte for byte as the source gave them.
	InputSchema  json.RawMessage `json:"input_schema,omitempty"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	Annotations  Annotations     `json:"annotations"`
	// Risk holds the level and side effects with where each came from.
	Risk             risk.Assessment `json:"risk"`
	Sensitive        bool            `json:"sensitive,omitempty"`
	AllowedChatTypes []string        `json:"allowed_chat_types,omitempty"`
	Mutating         bool            `json:"mutating,omitempty"`
	RequiresAuth     bool            `json:"requires_auth,omitempty"`
	Available        bool            `json:"available"`
	// DefinitionHash pins what the source said of the tool (see registry).
	DefinitionHash string `json:"definition_hash,omitempty"`
	// Launch is what the tool's process starts as, where capgate starts
	// one (an extension command, a stdio MCP server, a bridge provider):
	// its run argv, its program's sha256 and its declared guarantees
	// (sandbox.Launch). It is part of the pinned definition, so a pack
	// that rewrites its run or drops its capabilities is quarantined.
	Launch json.RawMessage `json:"launch,omitempty"`
	// Quarantined, when set, says why the tool is listed but never callable.
	Quarantined string `json:"quarantined,omitempty"`
	// Guarantees are what the tool cannot do, for a tool whose process
	// capgate starts; nil for one it only talks to.
	Guarantees *Guarantees `json:"guarantees,omitempty"`
}

// Clone returns a deep copy, so a gate can change it without touching the
// registry's snapshot.
func (d *Descriptor) Clone() *Descriptor {
	c := *d
	c.InputSchema = slices.Clone(d.InputSchema)
	c.OutputSchema = slices.Clone(d.OutputSchema)
	c.Annotations.ReadOnlyHint = cloneBool(d.Annotations.ReadOnlyHint)
	c.Annotations.DestructiveHint = cloneBool(d.Annotations.DestructiveHint)
	c.Annotations.IdempotentHint = cloneBool(d.Annotations.IdempotentHint)
	c.Annotations.OpenWorldHint = cloneBool(d.Annotations.OpenWorldHint)
	c.Risk.Effects = slices.Clone(d.Risk.Effects)
	c.Risk.Rules = slices.Clone(d.Risk.Rules)
	c.AllowedChatTypes = slices.Clone(d.AllowedChatTypes)
	c.Guarantees = d.Guarantees.Clone()
	c.Launch = slices.Clone(d.Launch)
	return &c
}

func cloneBool(b *bool) *bool {
	if b == nil {
		return nil
	}
	v := *b
	return &v
}

// Call is one invocation of a tool, as the router hands it to a source.
type Call struct {
	Tool *Descriptor
	// Sub is the verified caller's subject ("" for an anonymous caller):
	// for sources that act as each caller's own account upstream.
	Sub            string
	Input          json.RawMessage // a JSON object
	Account        string          // which stored credential to use, if any
	IdempotencyKey string
	// Secrets are the values of the skill whose run made this call
	// ([skills.NAME] env): a subprocess the call starts receives them as
	// secrets_allowed, and no other call does.
	Secrets map[string]string
	// Denied, when set, is told of each guarantee ("no_network",
	// "no_subprocess") that the kernel held the call's subprocess to when
	// it tried: called from another goroutine, before the call returns.
	Denied func(guarantee string)
	// ContextToken is a short-lived token the router signs for this call
	// from the verified caller's claims, for sources that want one.
	ContextToken string
	// Progress, when set, receives progress the source reports.
	Progress func(progress, total float64, message string)
	// Log, when set, receives the log messages the source sends while the
	// call runs (the params of an MCP notifications/message). Log and
	// Progress may be called from more than one goroutine.
	Log func(params json.RawMessage)
	// Ask, when set, relays a request the source makes of the calling
	// client mid-call (MCP sampling/createMessage, elicitation/create,
	// roots/list) and returns the client's answer. Without it such
	// requests are refused.
	Ask func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
	// Tasks: the calling client declared the MCP tasks extension on this
	// call, so a source whose upstream offers it may answer with a task
	// (Result.Task) instead of the result.
	Tasks bool
}

// SecretsEnv is c.Secrets as "NAME=value" entries, in name order.
func (c Call) SecretsEnv() []string {
	out := make([]string, 0, len(c.Secrets))
	for _, k := range slices.Sorted(maps.Keys(c.Secrets)) {
		out = append(out, k+"="+c.Secrets[k])
	}
	return out
}

// Result is what a tool returned: MCP content blocks, kept as raw JSON so
// they pass through unchanged, and optional structured content.
type Result struct {
	Content    []json.RawMessage `json:"content"`
	Structured json.RawMessage   `json:"structuredContent,omitempty"`
	IsError    bool              `json:"isError,omitempty"`
	// Task, when set, says the call became a task (the MCP tasks
	// extension, a CreateTaskResult): it is the upstream's Task object
	// (taskId, status, ...), and Content means nothing.
	Task json.RawMessage `json:"task,omitempty"`
}

// TasksExtension names the MCP tasks extension (SEP-2663).
const TasksExtension = "io.modelcontextprotocol/tasks"

// Tasker is a Source whose tools may answer with a task, and which relays
// the task methods (tasks/get, tasks/update, tasks/cancel) for it.
type Tasker interface {
	// OffersTasks says whether the source offers the tasks extension now.
	OffersTasks() bool
	// TaskRequest sends method for the source's own task id, with the
	// request's other params (a JSON object or nil), and returns the
	// raw result. An error the upstream answered with is passed on.
	TaskRequest(ctx context.Context, method, taskID string, params json.RawMessage) (json.RawMessage, error)
}

// TaskListener is a Tasker that can tell of its tasks' status changes.
type TaskListener interface {
	Tasker
	// ListenTasks asks, as ctx's caller, for the status notifications of
	// the source's own task ids until ctx ends. acked gets the ids the
	// upstream agreed to (again after a reconnection); on gets each
	// notification's params as they came. It returns when ctx ends, or
	// with the error of an upstream that refuses.
	ListenTasks(ctx context.Context, ids []string, acked func(agreed []string), on func(params json.RawMessage)) error
}

// TextResult returns a result with one text block.
func TextResult(text string) *Result {
	b, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	return &Result{Content: []json.RawMessage{b}}
}

// Source is one place tools come from.
type Source interface {
	// ID is the source's id within its kind, as in the tool id.
	ID() string
	Kind() Kind
	// List returns the source's tools. The descriptors are the caller's.
	List(ctx context.Context) ([]*Descriptor, error)
	// Call runs one tool of this source.
	Call(ctx context.Context, c Call) (*Result, error)
}

// Notifier is a Source that can tell when its tool list changed.
type Notifier interface {
	// OnChange registers f, called (from any goroutine) after a change.
	OnChange(f func())
}

// Bounded is a Source whose every Call returns within CallTimeout of its
// start, with an error of its own when the tool has not answered by then
// (sooner when ctx's deadline comes first). The router needs no timer of
// its own for a call such a source bounds within the router's timeout.
type Bounded interface {
	CallTimeout() time.Duration
}

// Closer is a Source holding processes or connections to release.
type Closer interface {
	Close() error
}

// AuthBegin is what starting an auth flow returns.
type AuthBegin struct {
	AuthURL string `json:"auth_url"`
	// Raw is the source's whole answer (flow state, expiry, ...), which the
	// host keeps and hands back to complete the flow.
	Raw json.RawMessage `json:"-"`
}

// Authenticator is a Source whose tools need a per-user credential that it
// obtains through an auth flow.
type Authenticator interface {
	AuthBegin(ctx context.Context, capabilityID, accountHint, contextToken string) (*AuthBegin, error)
	AuthComplete(ctx context.Context, capabilityID string, params json.RawMessage, contextToken string) (json.RawMessage, error)
}

type inputKey struct{}

type inputRound struct {
	key      string
	together int
}

// WithInputKey marks the Ask made with ctx as one of together asks a
// source makes at once (an upstream's input_required result), under the
// key the source gave it, so that a front door that asks in rounds can put
// them in one round under their own keys.
func WithInputKey(ctx context.Context, key string, together int) context.Context {
	return context.WithValue(ctx, inputKey{}, inputRound{key, together})
}

// InputKey is what WithInputKey put in ctx: "" and 1 when nothing.
func InputKey(ctx context.Context) (key string, together int) {
	r, ok := ctx.Value(inputKey{}).(inputRound)
	if !ok || r.together < 1 {
		return "", 1
	}
	return r.key, r.together
}

type askableKey struct{}

// WithAskable marks ctx with the capabilities the calling MCP client
// declared (its ClientCapabilities as JSON: sampling, elicitation,
// roots, ...), so that a source that declares capabilities upstream per
// request declares only what its caller can answer.
func WithAskable(ctx context.Context, caps json.RawMessage) context.Context {
	return context.WithValue(ctx, askableKey{}, caps)
}

// Askable is what WithAskable put in ctx; ok is false when nothing was.
func Askable(ctx context.Context) (caps json.RawMessage, ok bool) {
	caps, ok = ctx.Value(askableKey{}).(json.RawMessage)
	return caps, ok
}

type answersKey struct{}

// WithAnswers marks ctx with answers the calling client sent with a call
// that carries no requestState (MCP inputResponses, a JSON object by
// key): a source that asks in rounds passes them on with its first
// request, and its upstream takes what it recognises.
func WithAnswers(ctx context.Context, responses json.RawMessage) context.Context {
	return context.WithValue(ctx, answersKey{}, responses)
}

// Answers is what WithAnswers put in ctx, or nil.
func Answers(ctx context.Context) json.RawMessage {
	r, _ := ctx.Value(answersKey{}).(json.RawMessage)
	return r
}

type pauseKey struct{}

// Pause closes the calling client's stream of a call the way an upstream
// closed its own (SSE polling, MCP 2025-11-25): with an event asking the
// client to come back after retry. The channel is closed when the client
// comes back (resumes the stream); nil means the client's stream cannot
// be closed so (another protocol, or not resumable).
type Pause func(retry time.Duration) <-chan struct{}

// WithPause marks ctx with the calling client's Pause: a source whose
// upstream closes a call's stream with retry resumes it when the client
// comes back, so the client's timing is the upstream's.
func WithPause(ctx context.Context, p Pause) context.Context {
	return context.WithValue(ctx, pauseKey{}, p)
}

// PauseOf is what WithPause put in ctx, or nil.
func PauseOf(ctx context.Context) Pause {
	p, _ := ctx.Value(pauseKey{}).(Pause)
	return p
}
