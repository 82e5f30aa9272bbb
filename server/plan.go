package server

import (
	"encoding/json"
	"fmt"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
	"github.com/mark3labs/mcp-go/mcp"
)

// metaMode is where an MCP tools/call asks for a mode.
const metaMode = "capgate/mode"

// planning reads a call's mode: true for "planning", false when absent;
// any other value is refused, naming where it was read.
func planning(v any, present bool, where string) (bool, error) {
	if !present {
		return false, nil
	}
	if s, ok := v.(string); ok && s == router.ModePlanning {
		return true, nil
	}
	if s, ok := v.(string); ok && s == router.ModeExecution {
		return false, nil // AgentOS's explicit form of no mode
	}
	return false, &tool.Error{Code: tool.CodeInvalidInput, Gate: router.GateInput,
		Message: fmt.Sprintf("%s must be %q, %q or absent, not %s", where, router.ModePlanning, router.ModeExecution, shortJSON(v)),
		Hint:    "leave it out to make the call; set it to \"planning\" to see what the gates decide without running it"}
}

func shortJSON(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

// mcpPlan is a planning call's answer over MCP. The plan is the
// structuredContent and, as JSON, the text content. A denied plan is an
// isError result like a denial (with its capgate/error meta), so an agent
// reads it as "this call would fail". An allowed plan is not an error;
// but when the tool declares an outputSchema, which clients validate a
// successful structuredContent against, the plan is only in the text and
// in _meta["capgate/plan"], never a structuredContent the schema refuses.
func mcpPlan(p *router.Plan, outputSchema bool) *mcp.CallToolResult {
	b, err := json.Marshal(p)
	if err != nil {
		return mcpconv.Denial(tool.Wrap(err, tool.CodeInternal, "internal error"))
	}
	var res *mcp.CallToolResult
	if p.Denial != nil {
		res = mcpconv.Denial(&tool.Error{Code: p.Denial.Code, Gate: p.Denial.Gate, Required: p.Denial.Required,
			Message: p.Denial.Message, Hint: p.Denial.Hint})
		res.Content = append(res.Content, mcp.NewTextContent(string(b)))
	} else {
		res = mcp.NewToolResultText(string(b))
	}
	if p.Denial != nil || !outputSchema {
		res.StructuredContent = json.RawMessage(b)
	}
	if res.Meta == nil {
		res.Meta = &mcp.Meta{AdditionalFields: map[string]any{}}
	}
	res.Meta.AdditionalFields["capgate/plan"] = json.RawMessage(b)
	return res
}
