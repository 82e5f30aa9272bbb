package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/rawjson"
	"github.com/capgate/capgate/tool"
)

// Protocol 2026-07-28 (stateless) toward the upstreams that speak it. Over
// streamable HTTP capgate first asks server/discover at 2026-07-28 and
// falls back to the 2025-11-25 handshake per upstream (see open). On the
// stateless protocol every request carries capgate's protocol version,
// identity and capabilities in its _meta and the method and name in
// Mcp-Method and Mcp-Name headers; there is no session. An upstream asks
// the client for input by answering with an InputRequiredResult: capgate
// asks the calling client each request through tool.Call.Ask (a 2026
// client gets them as an input round of its own call, a 2025 one as
// requests on the call's stream) and retries with the answers and the
// upstream's requestState exactly as it came; the state never leaves
// capgate, so no client can change it or bring another's.

// maxInputRounds bounds the input rounds of one call.
const maxInputRounds = 16

// Modern is the stateless protocol revision capgate offers upstreams.
const Modern = mcpgo.LATEST_PROTOCOL_VERSION

// clientCaps are what capgate declares to an upstream: it relays these
// requests to the calling client.
var clientCaps = mcpgo.ClientCapabilities{
	Sampling:    &mcpgo.SamplingCapability{},
	Elicitation: &mcpgo.ElicitationCapability{Form: &struct{}{}, URL: &struct{}{}},
	Roots: &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{},
}

var clientInfo = mcpgo.Implementation{Name: "capgate", Version: "1"}

// modernMeta is the _meta members every stateless request carries, as
// JSON object members (no braces), made once: with every client
// capability capgate relays, for requests made for no known client.
var modernMeta = buildMeta(clientCaps)

// askNothingMeta is modernMeta declaring no client capability: for a call
// whose caller can be asked nothing.
var askNothingMeta = buildMeta(struct{}{})

func buildMeta(caps any) []byte {
	b, _ := json.Marshal(map[string]any{
		mcpgo.MetaKeyProtocolVersion:    Modern,
		mcpgo.MetaKeyClientCapabilities: caps,
		mcpgo.MetaKeyClientInfo:         clientInfo,
		mcpgo.MetaKeyLogLevel:           mcpgo.LoggingLevelDebug,
	})
	return b[1 : len(b)-1]
}

// relayedCaps are the client capabilities whose requests capgate relays.
var relayedCaps = []string{"sampling", "elicitation", "roots"}

// metaFor is the _meta members of a stateless request made for ctx. Its
// client capabilities are honest: of those capgate relays, what the
// calling client declared (tool.Askable), none when the caller can be
// asked nothing (asks false), all when no client is known (capgate's own
// requests, such as lists). An upstream must not ask a client what it
// did not say it can answer, and may refuse a call that needs it.
func metaFor(ctx context.Context, asks bool) []byte {
	if ctx.Value(tasksKey{}) != nil {
		return buildMeta(withTasksExtension(capsFor(ctx, asks)))
	}
	if !asks {
		return askNothingMeta
	}
	declared, ok := tool.Askable(ctx)
	if !ok {
		return modernMeta
	}
	var all map[string]json.RawMessage
	if json.Unmarshal(declared, &all) != nil {
		return askNothingMeta
	}
	caps := make(map[string]json.RawMessage, len(relayedCaps))
	for _, k := range relayedCaps {
		if v, ok := all[k]; ok && string(v) != "null" {
			caps[k] = v
		}
	}
	return buildMeta(caps)
}

type tasksKey struct{}

// withTasks marks ctx's requests as declaring the tasks extension: the
// caller declared it on its call, or it is a task method (tasks.go).
func withTasks(ctx context.Context) context.Context { return context.WithValue(ctx, tasksKey{}, true) }

// capsFor is metaFor's client capabilities as members.
func capsFor(ctx context.Context, asks bool) map[string]json.RawMessage {
	caps := map[string]json.RawMessage{}
	if !asks {
		return caps
	}
	declared, ok := tool.Askable(ctx)
	if !ok {
		declared, _ = json.Marshal(clientCaps)
	}
	var all map[string]json.RawMessage
	if json.Unmarshal(declared, &all) != nil {
		return caps
	}
	for _, k := range relayedCaps {
		if v, ok := all[k]; ok && string(v) != "null" {
			caps[k] = v
		}
	}
	return caps
}

// withTasksExtension adds the tasks extension to caps.
func withTasksExtension(caps map[string]json.RawMessage) map[string]json.RawMessage {
	caps["extensions"] = json.RawMessage(`{"` + tool.TasksExtension + `":{}}`)
	return caps
}

// modern reports whether l speaks the stateless protocol.
func (l *link) modern() bool { return mcpgo.IsModernProtocol(l.version) }

// modernParams returns params (a JSON object or nil) with capgate's _meta
// members for ctx (metaFor) added to its _meta.
func modernParams(ctx context.Context, params any) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &fields); err != nil {
			return nil, fmt.Errorf("params are not a JSON object: %w", err)
		}
	}
	if fields == nil {
		fields = map[string]json.RawMessage{}
	}
	fields["_meta"] = mergeMeta(metaFor(ctx, true), fields["_meta"])
	return json.Marshal(fields)
}

// mergeMeta adds capgate's members (metaFor) to a _meta object (raw, maybe
// empty).
func mergeMeta(ours []byte, meta json.RawMessage) json.RawMessage {
	meta = bytes.TrimSpace(meta)
	if len(meta) < 2 || string(meta) == "null" || string(meta) == "{}" {
		return append(append([]byte{'{'}, ours...), '}')
	}
	out := append([]byte{'{'}, ours...)
	out = append(out, ',')
	return append(out, meta[1:]...)
}

// standardHeaders are the Mcp-Method and Mcp-Name headers of a stateless
// request (SEP-2243).
func standardHeaders(method string, params json.RawMessage) http.Header {
	h := http.Header{}
	for k, v := range mcpgo.StandardHeaders(Modern, mcpgo.MCPMethod(method), params) {
		h.Set(k, v)
	}
	if id, ok := taskIDOf(method, params); ok {
		// A task method names its task, for balancers (SEP-2663).
		h.Set(mcpgo.HeaderName, id)
	}
	return h
}

// inputRequired is an InputRequiredResult as the upstream sent it.
type inputRequired struct {
	ResultType    string                     `json:"resultType"`
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
	RequestState  *json.RawMessage           `json:"requestState"`
}

// needsInput reads a response's result as an InputRequiredResult, or
// says no. The check is a byte search first: most results are not.
func needsInput(raw []byte) (*inputRequired, bool) {
	if !bytes.Contains(raw, []byte(`"input_required"`)) {
		return nil, false
	}
	var msg [2][]byte
	if !rawjson.Pick(raw, responseNames, msg[:]) || msg[0] == nil {
		return nil, false
	}
	var ir inputRequired
	if json.Unmarshal(msg[0], &ir) != nil || ir.ResultType != string(mcpgo.ResultTypeInputRequired) {
		return nil, false
	}
	return &ir, true
}

// fulfil asks the calling client every input request of ir at once (they
// may reach it in one round) and returns the answers by key.
func (s *Source) fulfil(ctx context.Context, call tool.Call, ir *inputRequired) (map[string]json.RawMessage, error) {
	if len(ir.InputRequests) > 0 && call.Ask == nil {
		return nil, tool.Errorf(tool.CodeBackendUnavailable,
			"mcp server %s: tools/call %s needs input from the client, which capgate cannot ask for this call", s.opts.Name, call.Tool.Name)
	}
	var (
		mu   sync.Mutex
		out  = make(map[string]json.RawMessage, len(ir.InputRequests))
		errs []error
		wg   sync.WaitGroup
	)
	for key, raw := range ir.InputRequests {
		var req struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(raw, &req); err != nil || req.Method == "" {
			return nil, tool.Errorf(tool.CodeInvalidOutput, "mcp server %s: input request %q is not a request", s.opts.Name, key)
		}
		if len(req.Params) == 0 {
			req.Params = json.RawMessage("{}")
		}
		ctx := tool.WithInputKey(ctx, key, len(ir.InputRequests))
		wg.Go(func() {
			res, rpcErr := answer(ctx, call, req.Method, req.Params)
			mu.Lock()
			defer mu.Unlock()
			if rpcErr != nil {
				errs = append(errs, fmt.Errorf("input request %q (%s): %s", key, req.Method, rpcErr.Message))
				return
			}
			out[key] = res
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "mcp server %s: tools/call %s: %v", s.opts.Name, call.Tool.Name, errs[0])
	}
	return out, nil
}

// retryBody is a tools/call body that answers ir: name and arguments as
// before, the answers, and the upstream's requestState as it came.
func retryBody(id, name string, args json.RawMessage, meta []byte, answers map[string]json.RawMessage, state *json.RawMessage) ([]byte, error) {
	params := map[string]json.RawMessage{"arguments": args}
	params["name"], _ = json.Marshal(name)
	if len(answers) > 0 {
		b, err := json.Marshal(answers)
		if err != nil {
			return nil, err
		}
		params["inputResponses"] = b
	}
	if state != nil {
		params["requestState"] = *state
	}
	if meta != nil {
		params["_meta"] = meta
	}
	return json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}
