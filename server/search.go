package server

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/toolsearch"
)

// search is tool search on /mcp ([discovery]): for a caller in search
// mode, tools/list is the pinned tools, search_tools and call_tool. The
// ranking and its index live in package toolsearch; this is the MCP glue.
type search struct {
	cfg     atomic.Pointer[toolsearch.Discovery]
	indexes *toolsearch.Indexes // shared with /rpc's capability.search
}

// SetDiscovery sets how callers discover tools (a reload may change it);
// clients are told the list changed.
func (m *MCP) SetDiscovery(d toolsearch.Discovery) {
	m.search.cfg.Store(&d)
	m.sync(m.reg().Snapshot())
}

func (m *MCP) discovery() toolsearch.Discovery {
	if d := m.search.cfg.Load(); d != nil {
		return *d
	}
	return toolsearch.Discovery{Mode: toolsearch.ModeList}
}

// Indexes is the tool search index of the catalog, one per snapshot.
func (m *MCP) Indexes() *toolsearch.Indexes { return m.search.indexes }

// searchTools are search_tools and call_tool, served when some caller may
// search; tools/list shows them only to callers in search mode.
func (m *MCP) searchTools() []mcpserver.ServerTool {
	if !m.discovery().On() {
		return nil
	}
	return []mcpserver.ServerTool{
		{Tool: searchToolBase(""), Handler: m.searchCall},
		{Tool: callToolBase(), Handler: m.callTool},
	}
}

func searchToolBase(desc string) mcp.Tool {
	t, f := true, false
	return mcp.Tool{Name: toolsearch.SearchTool, Description: desc, RawInputSchema: toolsearch.SearchSchema,
		Annotations: mcp.ToolAnnotation{Title: "Search tools", ReadOnlyHint: &t, DestructiveHint: &f,
			IdempotentHint: &t, OpenWorldHint: &f}}
}

func callToolBase() mcp.Tool {
	t, f := true, false
	return mcp.Tool{Name: toolsearch.CallTool, Description: toolsearch.CallDescription, RawInputSchema: toolsearch.CallSchema,
		Annotations: mcp.ToolAnnotation{Title: "Call a tool", ReadOnlyHint: &f, DestructiveHint: &t,
			IdempotentHint: &f, OpenWorldHint: &t}}
}

// searchFilter is tools/list for a caller in search mode: the pinned
// tools it may see, use_skill when it has skills, search_tools (whose
// description says what it can reach) and call_tool. ok is false for a
// caller that gets the whole list.
func (m *MCP) searchFilter(ctx context.Context, c *router.Caller, tools []mcp.Tool) (out []mcp.Tool, ok bool) {
	d := m.discovery()
	if !d.On() {
		return nil, false
	}
	p := m.parts.Load()
	snap := p.registry.Snapshot()
	visible := 0
	for _, t := range snap.Tools {
		if p.router.Visible(c, t) {
			visible++
		}
	}
	if !d.Searching(visible) {
		return nil, false
	}
	for _, t := range tools {
		switch t.Name {
		case UseSkill:
			if st, ok := m.useSkillTool(ctx, c); ok {
				out = append(out, st)
			}
		case toolsearch.SearchTool, toolsearch.CallTool:
		default:
			if dt, ok := snap.ByExposedName(t.Name); ok && d.IsPinned(dt.ID) && p.router.Visible(c, dt) {
				out = append(out, t)
			}
		}
	}
	total, sources := toolsearch.Reach(snap.Tools, func(t *tool.Descriptor) bool { return p.router.Reachable(c, t) })
	return append(out, searchToolBase(toolsearch.SearchDescription(total, sources)), callToolBase()), true
}

// searchCall is search_tools: the best matches among the tools the
// caller could call.
func (m *MCP) searchCall(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := CallerFrom(ctx)
	if c == nil {
		return mcpconv.Denial(tool.Errorf(tool.CodeTokenInvalid, "no verified caller")), nil
	}
	in, err := toolsearch.ParseSearch(mcpconv.RawArguments(req))
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	p := m.parts.Load()
	hits, err := SearchHits(m.search.indexes, p.registry.Snapshot(), p.router, c, in, false)
	if err != nil {
		return mcpconv.Denial(tool.Wrap(err, tool.CodeInternal, "tool search failed")), nil
	}
	b, err := json.Marshal(map[string]any{"tools": hits})
	if err != nil {
		return nil, err
	}
	return mcp.NewToolResultText(string(b)), nil
}

// SearchHits ranks snap's tools for in among those c could call; withID
// adds each tool's id (the capability RPC names tools by id).
func SearchHits(x *toolsearch.Indexes, snap *registry.Snapshot, rt *router.Router, c *router.Caller,
	in toolsearch.SearchInput, withID bool) ([]toolsearch.Hit, error) {
	found, err := x.Search(snap, in.Query, in.Limit, func(d *tool.Descriptor) bool { return rt.Reachable(c, d) })
	if err != nil {
		return nil, err
	}
	hits := make([]toolsearch.Hit, len(found))
	for i, d := range found {
		hits[i] = toolsearch.HitOf(d, withID)
	}
	return hits, nil
}

// callTool is call_tool: the named tool runs as a direct tools/call
// would, every gate included, audited as that tool with via call_tool.
func (m *MCP) callTool(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := toolsearch.ParseCall(mcpconv.RawArguments(req))
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	if in.Name == UseSkill {
		return mcpconv.Denial(tool.Errorf(tool.CodeInvalidInput, "%s input.name: call %s directly", toolsearch.CallTool, UseSkill)), nil
	}
	inner := req
	inner.Params.Name = in.Name
	inner.Params.Arguments, inner.Params.RawArguments = nil, in.Arguments
	return m.callVia(ctx, inner, toolsearch.CallTool)
}

// rpcSearch is the capability RPC's capability.search: search_tools's
// answer, each tool with its id.
func (m *MCP) rpcSearch(c *router.Caller, in toolsearch.SearchInput) ([]toolsearch.Hit, error) {
	p := m.parts.Load()
	return SearchHits(m.search.indexes, p.registry.Snapshot(), p.router, c, in, true)
}
