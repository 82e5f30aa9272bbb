// Package mcpconv converts between capgate's tool vocabulary and mcp-go's
// for the two MCP servers capgate runs, the front door (package server)
// and `capgate connect`: results, denials, hints, arguments, progress.
package mcpconv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sandbox"
	"github.com/capgate/capgate/tool"
)

// Annotations are MCP's hints as capgate shows them: per hint, the more
// cautious of what the upstream said and what capgate's classification
// says, since clients auto-approve on them. A hint the upstream did not
// give reads as the MCP spec's default (readOnly false, destructive true,
// idempotent false, openWorld true) unless the tool's side effects were
// declared by the operator or by the source (an extension's side_effects):
// that is evidence of what the tool does. Inferred effects and an
// operator's level alone are not: the first come from the upstream's own
// words, the second says how much to trust a call, not what it changes.
func Annotations(d *tool.Descriptor) mcp.ToolAnnotation {
	writes, destructive, open := d.Mutating, false, false
	for _, e := range d.Risk.Effects {
		writes = writes || e.Writes()
		switch e {
		case risk.FSDelete, risk.DatabaseDelete, risk.CloudResourceDelete, risk.Payments, risk.SystemExec, risk.CloudKeyWrite:
			destructive = true
		case risk.NetworkHTTP, risk.NetworkSocket, risk.NetworkDNS:
			open = true
		}
	}
	destructive = destructive || d.Risk.Level >= risk.High
	own := !writes && !destructive // capgate's read-only, and so idempotent
	declared := d.Risk.EffectsFrom == risk.FromOperator || d.Risk.EffectsFrom == risk.FromSource
	said := func(h *bool, spec, evidence bool) bool {
		switch {
		case h != nil:
			return *h
		case declared:
			return evidence
		}
		return spec
	}
	a := d.Annotations
	readOnly := said(a.ReadOnlyHint, false, own) && own
	// The spec's destructive default is for tools that write; a tool both
	// sides call read-only is not destructive unless one says so.
	destructive = said(a.DestructiveHint, !readOnly, destructive) || destructive
	readOnly = readOnly && !destructive
	idempotent := said(a.IdempotentHint, false, own) && own
	open = said(a.OpenWorldHint, true, open) || open
	// The kernel's proof outweighs every word: a tool that cannot reach
	// the network does not touch the open world.
	if g, ok := d.Guarantees.Get(string(sandbox.NoNetwork)); ok && g.Enforced {
		open = false
	}
	return mcp.ToolAnnotation{Title: d.Title, ReadOnlyHint: &readOnly, DestructiveHint: &destructive,
		IdempotentHint: &idempotent, OpenWorldHint: &open}
}

// RawArguments are the call's arguments as the client sent them.
func RawArguments(req mcp.CallToolRequest) json.RawMessage {
	if len(req.Params.RawArguments) == 0 && req.Params.Arguments != nil {
		b, _ := json.Marshal(req.Params.Arguments)
		return b
	}
	return req.Params.RawArguments
}

// Denial turns a router error into an isError result: the code first,
// then the message, the capability string and what would allow it.
func Denial(err error) *mcp.CallToolResult {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", tool.ErrorCode(err), tool.ErrorMessage(err))
	meta := map[string]any{"code": string(tool.ErrorCode(err))}
	var te *tool.Error
	if errors.As(err, &te) {
		if te.Required != "" {
			fmt.Fprintf(&b, "\nrequired: %s", te.Required)
			meta["required"] = te.Required
		}
		if te.Hint != "" {
			fmt.Fprintf(&b, "\nto allow it: %s", te.Hint)
			meta["hint"] = te.Hint
		}
		if te.Gate != "" {
			meta["gate"] = te.Gate
		}
		if te.AuthURL != "" {
			fmt.Fprintf(&b, "\nsign in: %s", te.AuthURL)
			meta["auth_url"] = te.AuthURL
		}
		if te.Reason != "" {
			meta["reason"] = te.Reason
		}
		if n := te.RetryAfterSeconds(); n > 0 {
			meta["retry_after_seconds"] = n
		}
	}
	res := mcp.NewToolResultError(b.String())
	res.Meta = &mcp.Meta{AdditionalFields: map[string]any{"capgate/error": meta}}
	return res
}

// ProgressSender relays progress to the client that asked for it with a
// progress token, through relay, which runs send on the request to send
// it on (the sender fails when mcp-go could not queue it); nil when the
// client asked for none.
func ProgressSender(relay func(send func(ctx context.Context) error), req mcp.CallToolRequest) func(progress, total float64, message string) {
	meta := req.Params.Meta
	if meta == nil || meta.ProgressToken == nil {
		return nil
	}
	token := meta.ProgressToken
	return func(progress, total float64, message string) {
		p := map[string]any{"progressToken": token, "progress": progress}
		if total > 0 {
			p["total"] = total
		}
		if message != "" {
			p["message"] = message
		}
		relay(func(ctx context.Context) error {
			return mcpserver.ServerFromContext(ctx).SendNotificationToClient(ctx, "notifications/progress", p)
		})
	}
}

// ToResult converts a tool result to mcp-go's form.
func ToResult(res *tool.Result) (*mcp.CallToolResult, error) {
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	rm := json.RawMessage(raw)
	out, err := mcp.ParseCallToolResult(&rm)
	if err != nil {
		return Denial(tool.Wrap(err, tool.CodeInvalidOutput, "the tool's result is not a valid MCP result")), nil
	}
	return out, nil
}

// ClientSampling reports whether the client of the request in ctx declared
// sampling, and sampling with tools: on 2026-07-28 in this request's
// _meta, before that at initialize.
func ClientSampling(ctx context.Context) (sampling, tools bool) {
	caps := ClientCapabilities(ctx)
	if caps == nil || caps.Sampling == nil {
		return false, false
	}
	return true, caps.Sampling.Tools != nil
}

// ClientCapabilities are the capabilities the client of the request in
// ctx declared: on 2026-07-28 in this request's _meta, before that at
// initialize; nil when mcp-go knows of none.
func ClientCapabilities(ctx context.Context) *mcp.ClientCapabilities {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.ClientCapabilities
	}
	if s, ok := mcpserver.ClientSessionFromContext(ctx).(mcpserver.SessionWithClientInfo); ok {
		c := s.GetClientCapabilities()
		return &c
	}
	return nil
}

// WithAskable is ctx marked with the capabilities its client declared
// (tool.WithAskable), when mcp-go knows them.
func WithAskable(ctx context.Context) context.Context {
	caps := ClientCapabilities(ctx)
	if caps == nil {
		return ctx
	}
	b, err := json.Marshal(caps)
	if err != nil {
		return ctx
	}
	return tool.WithAskable(ctx, b)
}
