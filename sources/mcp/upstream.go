package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/tool"
)

// What an upstream serves besides tools (resources, resource templates,
// prompts, completions), read for whoever relays it to a client: the MCP
// front door and `capgate connect`. Every answer passes harden first.

// Lists are an upstream's resources, resource templates (those with a URI
// template) and prompts.
type Lists struct {
	Resources []mcpgo.Resource
	Templates []mcpgo.ResourceTemplate
	Prompts   []mcpgo.Prompt
}

// Lists lists what s serves of the kinds it says it serves; nothing while
// it is not connected.
func (s *Source) Lists(ctx context.Context) Lists {
	var l Lists
	caps, ok := s.Capabilities()
	if !ok {
		return l
	}
	if caps.Resources != nil {
		l.Resources = listAll[mcpgo.Resource](ctx, s, "resources/list", "resources")
		for _, t := range listAll[mcpgo.ResourceTemplate](ctx, s, "resources/templates/list", "resourceTemplates") {
			if t.URITemplate != nil {
				l.Templates = append(l.Templates, t)
			}
		}
	}
	if caps.Prompts != nil {
		l.Prompts = listAll[mcpgo.Prompt](ctx, s, "prompts/list", "prompts")
	}
	return l
}

// listAll reads every page of a list method; a failing upstream lists
// what it gave until the next sync.
func listAll[T any](ctx context.Context, s *Source, method, field string) []T {
	var out []T
	s.Pages(ctx, method, func(raw json.RawMessage) (string, error) {
		var page map[string]json.RawMessage
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", err
		}
		var items []T
		if err := json.Unmarshal(page[field], &items); err != nil {
			return "", err
		}
		out = append(out, items...)
		var next string
		json.Unmarshal(page["nextCursor"], &next)
		return next, nil
	})
	return out
}

// ReadResource reads uri from s.
func (s *Source) ReadResource(ctx context.Context, uri string) ([]mcpgo.ResourceContents, error) {
	raw, err := s.Request(ctx, "resources/read", map[string]any{"uri": uri})
	if err != nil {
		return nil, upstreamError(err)
	}
	if f, ok := harden.JSON(raw); ok {
		return nil, harden.Withheld("resource "+uri, f)
	}
	res, err := mcpgo.ParseReadResourceResult(&raw)
	if err != nil {
		return nil, fmt.Errorf("resource %s: the upstream's answer: %w", uri, err)
	}
	return res.Contents, nil
}

// GetPrompt gets the prompt s calls name. round carries the answers to
// the input the upstream asked for in an earlier round and its
// requestState, as it sent it (the zero value for a first round); a result
// that needs input again comes back with its input requests and state.
func (s *Source) GetPrompt(ctx context.Context, name string, args map[string]string, round mcpgo.MultiRoundTripParams) (*mcpgo.GetPromptResult, error) {
	params := map[string]any{"name": name}
	if len(args) > 0 {
		params["arguments"] = args
	}
	if len(round.InputResponses) > 0 {
		params["inputResponses"] = round.InputResponses
	}
	if round.RequestState != "" {
		params["requestState"] = round.RequestState
	}
	raw, err := s.Request(ctx, "prompts/get", params)
	if err != nil {
		return nil, upstreamError(err)
	}
	if f, ok := harden.JSON(raw); ok {
		return nil, harden.Withheld("prompt "+name, f)
	}
	return mcpgo.ParseGetPromptResult(&raw)
}

// Complete asks s to complete arg of the prompt or resource ref names.
func (s *Source) Complete(ctx context.Context, ref map[string]any, arg mcpgo.CompleteArgument, cc mcpgo.CompleteContext) (*mcpgo.Completion, error) {
	params := map[string]any{"ref": ref, "argument": arg}
	if len(cc.Arguments) > 0 {
		params["context"] = cc
	}
	raw, err := s.Request(ctx, "completion/complete", params)
	if err != nil {
		return nil, upstreamError(err)
	}
	if f, ok := harden.JSON(raw); ok {
		return nil, harden.Withheld("completion", f)
	}
	var res struct {
		Completion mcpgo.Completion `json:"completion"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("completion: the upstream's answer: %w", err)
	}
	if res.Completion.Values == nil {
		res.Completion.Values = []string{}
	}
	return &res.Completion, nil
}

// upstreamError passes on the upstream's own error (the source has
// hardened it), or says with its code why it was withheld.
func upstreamError(err error) error {
	var re *RPCError
	if errors.As(err, &re) {
		return re
	}
	if tool.ErrorCode(err) == tool.CodeInvalidOutput {
		return fmt.Errorf("%s: %s", tool.CodeInvalidOutput, tool.ErrorMessage(err))
	}
	return errors.New(tool.ErrorMessage(err))
}
