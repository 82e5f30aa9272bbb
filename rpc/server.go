// Package rpc is the capability RPC: JSON-RPC 2.0 over HTTP with the
// methods and shapes of Ash's capabilities spec, as a handler over a
// router (served at /rpc by package server) and as a client (`capgate
// capability`).
package rpc

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/telemetry"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/toolsearch"
)

// The caller's identity is the context_token in params
// (or a bearer token); identity fields in params are never read.

// JSON-RPC error codes.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
	rpcInvalidParams  = -32602
	rpcInternalError  = -32603
)

type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type rpcError struct {
	Code    int      `json:"code"`
	Message string   `json:"message"`
	Data    *rpcData `json:"data,omitempty"`
}

type rpcData struct {
	Code         tool.Code `json:"code"`
	Gate         string    `json:"gate,omitempty"`
	Required     string    `json:"required,omitempty"`
	Hint         string    `json:"hint,omitempty"`
	AuthURL      string    `json:"auth_url,omitempty"` // capability_auth_required: where to sign in
	InvocationID string    `json:"invocation_id,omitempty"`
	// ClientInvocationID echoes the caller's invocation_id.
	ClientInvocationID string `json:"client_invocation_id,omitempty"`
	// Reason and RetryAfterSeconds: see tool.Error.
	Reason            string `json:"reason,omitempty"`
	RetryAfterSeconds int    `json:"retry_after_seconds,omitempty"`
}

// invokeError is a refused or failed call, with the id of its audit
// records and the caller's own id for it.
type invokeError struct {
	error
	id, client string
}

func (e invokeError) Unwrap() error { return e.error }

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// Handler serves the capability RPC over HTTP (POST).
type Handler struct {
	Router *router.Router
	// MaxBody bounds a request body (default httpadmit.MaxRequestBytes). The token
	// travels in the body (Ash's context_token), so the body is read,
	// within this bound, before the caller is known.
	MaxBody int64
	// Search answers capability.search: the tools c could call that best
	// match the query. nil: the method is refused.
	Search func(c *router.Caller, in toolsearch.SearchInput) ([]toolsearch.Hit, error)
	// Metrics and Tracer observe every request (nil: off), as the front
	// door does MCP's; ExposedName names a tool id capgate serves (false:
	// none) for their labels.
	Metrics     *telemetry.Metrics
	Tracer      *telemetry.Tracer
	ExposedName func(id string) (string, bool)
}

type rpcMethod func(h *Handler, r *http.Request, c *router.Caller, params json.RawMessage) (any, error)

var rpcMethods = map[string]rpcMethod{
	"capability.list":          (*Handler).list,
	"capability.invoke":        (*Handler).invoke,
	"capability.search":        (*Handler).search,
	"capability.auth.begin":    (*Handler).authBegin,
	"capability.auth.complete": (*Handler).authComplete,
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "the capability RPC takes POST", http.StatusMethodNotAllowed)
		return
	}
	limit := h.MaxBody
	if limit <= 0 {
		limit = httpadmit.MaxRequestBytes
	}
	body, ok := httpadmit.ReadBody(w, r, limit)
	if !ok {
		return
	}
	writeRPC(w, h.handle(r, body))
}

func writeRPC(w http.ResponseWriter, resp rpcResponse) {
	resp.JSONRPC = "2.0"
	if resp.ID == nil {
		resp.ID = json.RawMessage("null")
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (h *Handler) handle(r *http.Request, body []byte) rpcResponse {
	var req rpcRequest
	err := json.Unmarshal(body, &req)
	if h.Metrics == nil && h.Tracer == nil {
		return h.dispatch(r, req, err)
	}
	ctx, op := telemetry.BeginRPC(r.Context(), h.Metrics, h.Tracer, h.opRequest(r, req, err))
	resp := h.dispatch(r.WithContext(ctx), req, err)
	if e := resp.Error; e != nil {
		if e.Data != nil {
			op.Fail(string(e.Data.Code))
		} else {
			op.Fail(strconv.Itoa(e.Code)) // a JSON-RPC error: its code, as the conventions say
		}
	}
	op.End()
	return resp
}

// opRequest is what the metrics and the span name of req: only a method
// of the RPC, and a tool capgate serves, by its exposed name, else
// telemetry.Other.
func (h *Handler) opRequest(r *http.Request, req rpcRequest, parseErr error) telemetry.RPCRequest {
	o := telemetry.RPCRequest{Method: telemetry.Other, TraceParent: r.Header.Get("traceparent"), TraceState: r.Header.Get("tracestate")}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		o.Transport = a.Network()
	}
	if parseErr != nil {
		return o
	}
	o.ID = strings.Trim(string(req.ID), `"`)
	if _, ok := rpcMethods[req.Method]; ok {
		o.Method = req.Method
	}
	if o.Method == "capability.invoke" {
		o.Tool = telemetry.Other
		var p struct{ Capability, Operation string }
		if json.Unmarshal(req.Params, &p) == nil && h.ExposedName != nil {
			if id, err := toolID(p.Capability, p.Operation); err == nil {
				if name, ok := h.ExposedName(id); ok {
					o.Tool, o.ToolID = name, id
				}
			}
		}
	}
	return o
}

// dispatch answers req (parseErr: its body was not JSON).
func (h *Handler) dispatch(r *http.Request, req rpcRequest, parseErr error) rpcResponse {
	if parseErr != nil {
		return rpcResponse{Error: &rpcError{Code: rpcParseError, Message: "parse error: " + parseErr.Error()}}
	}
	resp := rpcResponse{ID: req.ID}
	if req.JSONRPC != "2.0" || req.Method == "" {
		resp.Error = &rpcError{Code: rpcInvalidRequest, Message: `invalid request: jsonrpc must be "2.0" and method set`}
		return resp
	}
	// An unknown method is answered before any token check.
	m, ok := rpcMethods[req.Method]
	if !ok {
		resp.Error = &rpcError{Code: rpcMethodNotFound, Message: "method not found: " + req.Method}
		return resp
	}
	params := req.Params
	if len(params) == 0 || string(params) == "null" {
		params = json.RawMessage("{}")
	}
	var tok struct {
		ContextToken *string `json:"context_token"`
	}
	if err := json.Unmarshal(params, &tok); err != nil {
		resp.Error = &rpcError{Code: rpcInvalidParams, Message: "params must be an object"}
		return resp
	}
	raw := ""
	if tok.ContextToken != nil {
		raw = *tok.ContextToken
	} else {
		raw = httpadmit.Bearer(r)
	}
	caller, err := h.Router.Authenticate(raw)
	if err != nil {
		resp.Error = &rpcError{Code: rpcInvalidParams, Message: rpcMessage(err), Data: rpcErrData(err)}
		return resp
	}
	// Token exchange (upstreamauth) trades this same token at its issuer.
	r = r.WithContext(router.WithCallerToken(r.Context(), caller, raw))
	result, err := m(h, r, caller, params)
	if err != nil {
		code := rpcInternalError
		var pe paramsError
		if errors.As(err, &pe) {
			code = rpcInvalidParams
		}
		resp.Error = &rpcError{Code: code, Message: rpcMessage(err), Data: rpcErrData(err)}
		return resp
	}
	resp.Result = result
	return resp
}

// paramsError is a malformed params object: -32602.
type paramsError struct{ msg string }

func (e paramsError) Error() string { return e.msg }

func decodeParams(params json.RawMessage, v any) error {
	if err := json.Unmarshal(params, v); err != nil {
		return paramsError{"invalid params: " + err.Error()}
	}
	return nil
}

// rpcMessage is "code: text", the caller-safe message of err.
func rpcMessage(err error) string {
	var pe paramsError
	if errors.As(err, &pe) {
		return pe.msg
	}
	return string(tool.ErrorCode(err)) + ": " + tool.ErrorMessage(err)
}

func rpcErrData(err error) *rpcData {
	var pe paramsError
	if errors.As(err, &pe) {
		return nil
	}
	d := &rpcData{Code: tool.ErrorCode(err)}
	var ie invokeError
	if errors.As(err, &ie) {
		d.InvocationID, d.ClientInvocationID = ie.id, ie.client
	}
	var te *tool.Error
	if errors.As(err, &te) {
		d.Gate, d.Required, d.Hint, d.AuthURL = te.Gate, te.Required, te.Hint, te.AuthURL
		d.Reason, d.RetryAfterSeconds = te.Reason, te.RetryAfterSeconds()
	}
	return d
}

// Capability is one entry of capability.list: a bridge capability with its
// operations, or any other tool as a capability of its own.
type Capability struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	Available   bool   `json:"available"`
	// UnavailableReason says why a capability listed with
	// include_unavailable cannot be called now.
	UnavailableReason string      `json:"unavailable_reason,omitempty"`
	RequiresAuth      bool        `json:"requires_auth"`
	Sensitive         bool        `json:"sensitive,omitempty"`
	Operations        []Operation `json:"operations"`
}

type Operation struct {
	Name         string          `json:"name"`
	Tool         string          `json:"tool"` // the tool id
	Description  string          `json:"description"`
	RequiresAuth bool            `json:"requires_auth"`
	Mutating     bool            `json:"mutating,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema,omitempty"`
}

// defaultOperation is the one operation of a capability that is a plain
// tool (an extension command or an upstream MCP tool).
const defaultOperation = "call"

func (h *Handler) list(_ *http.Request, c *router.Caller, params json.RawMessage) (any, error) {
	var p struct {
		IncludeUnavailable bool `json:"include_unavailable"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	caps := []Capability{}
	index := map[string]int{}
	for _, d := range h.Router.List(c, nil, registry.Filter{AvailableOnly: !p.IncludeUnavailable}) {
		id, op := router.CapabilityID(d), defaultOperation
		desc := d.Description
		if d.Kind == tool.KindBridge {
			_, op, _ = strings.Cut(d.Name, ".")
			desc = d.Title
		}
		// A tool this chat may not call is listed only on request, as
		// unavailable with the chat gate's reason (Ash).
		why, chat := unavailable(c, d)
		if chat && !p.IncludeUnavailable {
			continue
		}
		i, ok := index[id]
		if !ok {
			i = len(caps)
			index[id] = i
			caps = append(caps, Capability{ID: id, Description: desc, Available: true, Sensitive: d.Sensitive})
		}
		cp := &caps[i]
		cp.Available = cp.Available && why == ""
		if cp.UnavailableReason == "" {
			cp.UnavailableReason = why
		}
		cp.RequiresAuth = cp.RequiresAuth || d.RequiresAuth
		cp.Operations = append(cp.Operations, Operation{Name: op, Tool: d.ID, Description: d.Description,
			RequiresAuth: d.RequiresAuth, Mutating: d.Mutating, InputSchema: d.InputSchema})
	}
	return map[string]any{"capabilities": caps}, nil
}

// search is capability.search: params query and limit (1..20, default
// 5), as MCP's search_tools takes them; the answer names each tool by id.
func (h *Handler) search(_ *http.Request, c *router.Caller, params json.RawMessage) (any, error) {
	if h.Search == nil {
		return nil, tool.Errorf(tool.CodeNotFound, "capability.search is not served here")
	}
	in, err := toolsearch.ParseSearch(params)
	if err != nil {
		return nil, paramsError{"invalid params: " + tool.ErrorMessage(err)}
	}
	hits, err := h.Search(c, in)
	if err != nil {
		return nil, tool.Wrap(err, tool.CodeInternal, "tool search failed")
	}
	return map[string]any{"tools": hits}, nil
}

// unavailable says why c cannot call d now, or "" when it can; chat
// reports that the chat gate is why.
func unavailable(c *router.Caller, d *tool.Descriptor) (why string, chat bool) {
	switch {
	case d.Quarantined != "":
		return "quarantined: " + d.Quarantined, false
	case !d.Available:
		return "its source is not answering", false
	}
	if err := router.ChatRefusal(c, d); err != nil {
		return string(tool.ErrorCode(err)) + ": " + tool.ErrorMessage(err), true
	}
	return "", false
}

func (h *Handler) invoke(r *http.Request, c *router.Caller, params json.RawMessage) (any, error) {
	var p struct {
		Capability     string          `json:"capability"`
		Operation      string          `json:"operation"`
		Input          json.RawMessage `json:"input"`
		Account        string          `json:"account"`
		IdempotencyKey string          `json:"idempotency_key"`
		Mode           *string         `json:"mode"` // "planning"; "execution" or absent to run
		// InvocationID is the caller's own id (AgentOS): capgate keeps its
		// own and records and echoes this one as client_invocation_id.
		InvocationID string `json:"invocation_id"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if strings.TrimSpace(p.Capability) == "" {
		return nil, paramsError{"invalid params: capability is required"}
	}
	if p.Mode != nil && *p.Mode == router.ModeExecution {
		p.Mode = nil // AgentOS's explicit form of no mode
	}
	if p.Mode != nil && *p.Mode != router.ModePlanning {
		return nil, paramsError{`invalid params: mode must be "` + router.ModePlanning + `", "` + router.ModeExecution +
			`" or absent, not ` + shortJSON(*p.Mode)}
	}
	if err := router.CheckClientInvocationID(p.InvocationID); err != nil {
		return nil, paramsError{"invalid params: invocation_id " + err.Error()}
	}
	name, err := toolID(p.Capability, p.Operation)
	if err != nil {
		return nil, err
	}
	if p.Mode != nil {
		// A planning call answers with the decision, allowed or not: the
		// planning itself succeeded. Nothing runs. The RPC names tools by
		// id only: an MCP exposed name is not an id.
		requestID := router.NewInvocationID()
		plan, err := h.Router.Plan(r.Context(), c, router.Request{Tool: name, ByID: true, Input: p.Input, Account: p.Account,
			IdempotencyKey: p.IdempotencyKey, Protocol: "capability-rpc", RequestID: requestID, ClientInvocationID: p.InvocationID})
		if err != nil {
			return nil, err
		}
		out := map[string]any{"ok": plan.Allowed, "mode": router.ModePlanning, "plan": plan, "request_id": requestID}
		if p.InvocationID != "" {
			out["client_invocation_id"] = p.InvocationID
		}
		return out, nil
	}
	// The RPC names tools by id only: an MCP exposed name is not an id.
	res, inv, err := h.Router.Invoke(r.Context(), c, router.Request{Tool: name, ByID: true, Input: p.Input, Account: p.Account,
		IdempotencyKey: p.IdempotencyKey, Protocol: "capability-rpc", ClientInvocationID: p.InvocationID})
	if err != nil {
		return nil, invokeError{err, inv.ID, p.InvocationID}
	}
	if res.IsError {
		telemetry.OpFrom(r.Context()).Fail(telemetry.ToolError)
	}
	// request_id is the invocation id, under the name Ash's spec gives it.
	out := map[string]any{"ok": !res.IsError, "output": output(res), "request_id": inv.ID,
		"invocation_id": inv.ID, "duration_ms": inv.DurationMS(), "side_effects": inv.SideEffectNames()}
	if p.InvocationID != "" {
		out["client_invocation_id"] = p.InvocationID
	}
	return out, nil
}

// toolID is the id of the tool a capability and operation name: the
// capability itself, or for a bridge capability gog.email with operation
// send, the tool bridge:gog:email.send.
func toolID(capability, operation string) (string, error) {
	if operation == "" || operation == defaultOperation {
		return capability, nil
	}
	ns, capName, ok := strings.Cut(capability, ".")
	if !ok {
		return "", tool.Errorf(tool.CodeNotFound, "no capability named %q: capability ids are namespaced, such as gog.email", capability)
	}
	return tool.ID(tool.KindBridge, ns, capName+"."+operation), nil
}

// output is the structured result when there is one, else the content.
func output(res *tool.Result) any {
	if len(res.Structured) > 0 {
		return res.Structured
	}
	return map[string]any{"content": res.Content}
}

// shortJSON is v as JSON, cut to 64 bytes, to quote in an error.
func shortJSON(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

func (h *Handler) authBegin(r *http.Request, c *router.Caller, params json.RawMessage) (any, error) {
	var p struct {
		Capability  string `json:"capability"`
		AccountHint string `json:"account_hint"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	return h.Router.AuthBegin(r.Context(), c, p.Capability, p.AccountHint)
}

func (h *Handler) authComplete(r *http.Request, c *router.Caller, params json.RawMessage) (any, error) {
	var p struct {
		FlowID      string `json:"flow_id"`
		CallbackURL string `json:"callback_url"`
		Code        string `json:"code"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	account, err := h.Router.AuthComplete(r.Context(), c, p.FlowID, p.CallbackURL, p.Code)
	if err != nil {
		return nil, err
	}
	return map[string]any{"ok": true, "account_ref": account}, nil
}
