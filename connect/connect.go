// Package connect is `capgate connect`: a stdio MCP server that mirrors a
// remote capgate's /mcp endpoint, for a sandboxed runtime to reach the host.
package connect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/internal/buildinfo"
	"github.com/capgate/capgate/internal/httpadmit"
	"github.com/capgate/capgate/internal/mcpconv"
	mcpsrc "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// Serve serves over in and out, as a stdio MCP server, the tools,
// resources, resource templates and prompts (skills among them) of a remote
// capgate at url (its /mcp endpoint), calling it with tok as the bearer
// token: how a sandboxed runtime reaches the host. The remote decides
// everything; this side only forwards, progress and completions included.
func Serve(ctx context.Context, url, tok string, in io.Reader, out io.Writer, logger *slog.Logger) error {
	src, err := mcpsrc.New(mcpsrc.Options{Name: "remote", URL: url, Logger: logger,
		Headers: map[string]string{"Authorization": "Bearer " + tok}})
	if err != nil {
		return err
	}
	defer src.Close()
	if err := src.Connect(ctx); err != nil {
		if errors.Is(err, transport.ErrAuthorizationRequired) {
			if why := refusal(ctx, url, tok); why != "" {
				return fmt.Errorf("connecting to %s: the remote refused the token: %s", url, why)
			}
		}
		return fmt.Errorf("connecting to %s: %w", url, err)
	}
	mr := &mirror{src: src}
	srv := mcpserver.NewMCPServer("capgate-connect", buildinfo.Version(), mcpserver.WithToolCapabilities(true),
		mcpserver.WithToolFilter(withoutUseSkill),
		mcpserver.WithResourceCapabilities(false, true), mcpserver.WithPromptCapabilities(true),
		mcpserver.WithCompletions(), mcpserver.WithPromptCompletionProvider(mr), mcpserver.WithResourceCompletionProvider(mr))
	mr.srv = srv
	syncTools := func() {
		ds, err := src.List(ctx)
		if err != nil {
			logger.Warn("listing the remote's tools failed", "err", err)
			return
		}
		tools := make([]mcpserver.ServerTool, 0, len(ds))
		for _, d := range ds {
			tools = append(tools, mcpserver.ServerTool{Tool: remoteTool(d), Handler: forward(src, d)})
		}
		srv.SetTools(tools...)
	}
	syncTools()
	mr.sync(ctx)
	src.OnChange(func() { syncTools(); mr.sync(ctx) })
	src.OnNotification(func(method string, _ json.RawMessage) {
		if method == "notifications/resources/list_changed" || method == "notifications/prompts/list_changed" {
			go mr.sync(ctx)
		}
	})
	return mcpserver.NewStdioServer(srv).Listen(ctx, in, out)
}

// mirror serves the remote's resources, resource templates and prompts as
// the remote lists them to this token (it has gated them already), and
// forwards reads, gets and completions to it. Subscriptions are not
// forwarded.
type mirror struct {
	src *mcpsrc.Source
	srv *mcpserver.MCPServer
	mu  sync.Mutex // one sync at a time, so an older list never wins
}

func (mr *mirror) sync(ctx context.Context) {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if _, ok := mr.src.Capabilities(); !ok {
		return // keep the last lists until the remote is back
	}
	l := mr.src.Lists(ctx)
	resources := make([]mcpserver.ServerResource, 0, len(l.Resources))
	for _, r := range l.Resources {
		resources = append(resources, mcpserver.ServerResource{Resource: r, Handler: mr.read})
	}
	templates := make([]mcpserver.ServerResourceTemplate, 0, len(l.Templates))
	for _, t := range l.Templates {
		templates = append(templates, mcpserver.ServerResourceTemplate{Template: t, Handler: mr.read})
	}
	prompts := make([]mcpserver.ServerPrompt, 0, len(l.Prompts))
	for _, p := range l.Prompts {
		prompts = append(prompts, mcpserver.ServerPrompt{Prompt: p, Handler: mr.getPrompt})
	}
	mr.srv.SetResources(resources...)
	mr.srv.SetResourceTemplates(templates...)
	mr.srv.SetPrompts(prompts...)
}

func (mr *mirror) read(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	return mr.src.ReadResource(ctx, req.Params.URI)
}

func (mr *mirror) getPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	return mr.src.GetPrompt(ctx, req.Params.Name, req.Params.Arguments, req.Params.MultiRoundTripParams)
}

func (mr *mirror) CompletePromptArgument(ctx context.Context, name string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	return mr.src.Complete(ctx, map[string]any{"type": "ref/prompt", "name": name}, arg, cc)
}

func (mr *mirror) CompleteResourceArgument(ctx context.Context, uri string, arg mcp.CompleteArgument, cc mcp.CompleteContext) (*mcp.Completion, error) {
	return mr.src.Complete(ctx, map[string]any{"type": "ref/resource", "uri": uri}, arg, cc)
}

// remoteTool lists a remote tool as the remote listed it, its hints
// merged as annotations merges an upstream's: a hint the remote left out
// is the spec's cautious default, never a permissive one.
func remoteTool(d *tool.Descriptor) mcp.Tool {
	schema := d.InputSchema
	if len(schema) == 0 {
		schema = json.RawMessage(`{"type":"object"}`)
	}
	t := mcp.Tool{Name: d.Name, Title: d.Title, Description: d.Description, RawInputSchema: schema,
		Annotations: mcpconv.Annotations(d)}
	if len(d.OutputSchema) > 0 {
		t.RawOutputSchema = d.OutputSchema
	}
	return t
}

func forward(src *mcpsrc.Source, d *tool.Descriptor) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		call := tool.Call{Tool: d, Input: mcpconv.RawArguments(req), Progress: mcpconv.ProgressSender(func(send func(context.Context) error) { send(ctx) }, req),
			Ask: askClient}
		res, err := src.Call(ctx, call)
		if err == nil {
			err = harden.Output(d.ID, res) // the remote hardened it; so does this side
		}
		if err != nil {
			return mcpconv.Denial(err), nil
		}
		return mcpconv.ToResult(res)
	}
}

// useSkill is the remote's tool that runs a skill on the client's model
// (server.UseSkill): it works only for a client that samples.
const useSkill = "use_skill"

// withoutUseSkill lists use_skill only to a client that declared sampling
// and that connect can ask (one of 2025-11-25: connect does not yet ask a
// 2026-07-28 client in input rounds); the remote lists it to connect,
// which relays sampling, whoever its own client is.
func withoutUseSkill(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	if ok, _ := mcpconv.ClientSampling(ctx); ok && !mcp.IsModernProtocol(mcpserver.RequestProtocolVersion(ctx)) {
		return tools
	}
	return slices.DeleteFunc(tools, func(t mcp.Tool) bool { return t.Name == useSkill })
}

// askClient relays the remote's sampling request (a skill's model turn)
// to this side's client, which declared sampling; anything else it
// refuses.
func askClient(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if method != string(mcp.MethodSamplingCreateMessage) {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "capgate connect relays only sampling, not %s", method)
	}
	if ok, _ := mcpconv.ClientSampling(ctx); !ok {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "this client did not declare sampling")
	}
	var req mcp.CreateMessageRequest
	if err := json.Unmarshal(params, &req.CreateMessageParams); err != nil {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "sampling/createMessage params: %v", err)
	}
	srv := mcpserver.ServerFromContext(ctx)
	if srv == nil {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "no client to ask")
	}
	res, err := srv.RequestSampling(ctx, req)
	if err != nil {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "the client's sampling: %v", err)
	}
	return json.Marshal(res)
}

// refusal asks the remote once more why it refuses tok, since mcp-go keeps
// only "authorization required" of its 401: the Bearer challenge's error
// and error_description (RFC 6750), else the first line of the body.
// The token itself never appears in what it returns.
func refusal(ctx context.Context, url, tok string) string {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"capgate-connect","version":"1"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		return ""
	}
	c := httpadmit.BearerChallenge(resp.Header.Values("WWW-Authenticate"))
	var why string
	switch {
	case c["error_description"] != "":
		why = c["error"] + ": " + c["error_description"]
	case c["error"] != "":
		why = c["error"]
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		why, _, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
	}
	if why == "" {
		why = resp.Status
	} else {
		why = fmt.Sprintf("%s (HTTP %d)", why, resp.StatusCode)
	}
	if m := c["resource_metadata"]; m != "" && c["error"] == "" {
		why += "; its protected-resource metadata, naming where to get a token: " + m
	}
	if tok != "" {
		why = strings.ReplaceAll(why, tok, "[the token]")
	}
	return why
}
