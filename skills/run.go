package skills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
)

// DefaultMaxTokens is RunOptions.MaxTokens when it is not set.
const DefaultMaxTokens = 4096

// Sampler asks the calling client's model for one message (sampling/createMessage).
type Sampler func(ctx context.Context, p mcp.CreateMessageParams) (*mcp.CreateMessageResult, error)

// Caller runs one inner tool call (capgate passes it through its router with
// the skill's scope). A denial comes back as a result with IsError, not as
// an error; an error stops the loop (e.g. the context was cancelled).
type Caller func(ctx context.Context, tool string, input json.RawMessage) (*mcp.CallToolResult, error)

// RunOptions are the inputs of Run.
type RunOptions struct {
	Skill   *Skill
	Message string // what the caller asks the skill to do (required)
	Context string // optional context from the caller
	// Model is a model hint; it overrides Skill.Model when set.
	Model string
	// Tools are the tools offered to the model, already restricted to the
	// skill's allowed_tools by the caller of Run.
	Tools     []mcp.Tool
	Sample    Sampler
	Call      Caller
	MaxTokens int // per sampling request; DefaultMaxTokens when 0
	// Resume goes on with a run from where it asked the model: its first
	// sampling request is Resume's, so the answer to the question Resume
	// was taken at can be given then. nil: a new run from Message.
	Resume *Checkpoint
	// Checkpoint, when set, is told where the run stands before each
	// sampling request, so that the run can go on elsewhere (Resume).
	Checkpoint func(Checkpoint)
}

// Checkpoint is where a run stands when it asks the model: the
// conversation so far and its counters. It is all another process needs
// to go on with the run from the model's answer.
type Checkpoint struct {
	Messages  []mcp.SamplingMessage `json:"messages"`
	Iteration int                   `json:"iteration"` // the sampling request about to be made, from 1
	ToolCalls int                   `json:"tool_calls"`
	LastText  string                `json:"last_text,omitempty"`
}

// RunResult is what a skill's loop produced.
type RunResult struct {
	Output     string // the model's final text (or the last text seen, when partial)
	Iterations int    // sampling requests made
	Partial    bool   // stopped at max_iterations before the model finished
	ToolCalls  int
}

// Run runs a skill as a subagent in an isolated loop on the calling
// client's model (MCP sampling with tools), as Ash's use_skill does: the
// model sees only the skill's instructions, the caller's message and
// context, and the offered tools. It stops when the model answers without
// asking for a tool, or at the skill's max_iterations with Partial set.
func Run(ctx context.Context, o RunOptions) (*RunResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := o.Skill
	maxIter := s.MaxIterations
	if maxIter <= 0 {
		maxIter = DefaultMaxIterations
	}
	maxTokens := o.MaxTokens
	if maxTokens <= 0 {
		maxTokens = DefaultMaxTokens
	}

	first := o.Message
	if o.Context != "" {
		first += "\n\nContext:\n" + o.Context
	}
	messages := []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(first)}}

	params := mcp.CreateMessageParams{
		SystemPrompt: systemPrompt(s),
		MaxTokens:    maxTokens,
	}
	model := o.Model
	if model == "" {
		model = s.Model
	}
	if model != "" {
		params.ModelPreferences = &mcp.ModelPreferences{Hints: []mcp.ModelHint{{Name: model}}}
	}
	offered := make([]string, 0, len(o.Tools))
	if len(o.Tools) > 0 {
		params.Tools = o.Tools
		params.ToolChoice = &mcp.ToolChoice{Mode: mcp.ToolChoiceModeAuto}
		for _, t := range o.Tools {
			offered = append(offered, t.Name)
		}
	}

	res := &RunResult{}
	lastText := ""
	start := 1
	if r := o.Resume; r != nil {
		if r.Iteration < 1 || r.Iteration > maxIter || len(r.Messages) == 0 {
			return nil, fmt.Errorf("skill %s: resume at iteration %d of %d with %d messages: not a checkpoint of this skill",
				s.Name, r.Iteration, maxIter, len(r.Messages))
		}
		messages, start, res.ToolCalls, lastText = slices.Clone(r.Messages), r.Iteration, r.ToolCalls, r.LastText
	}
	for iter := start; iter <= maxIter; iter++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("skill %s: iteration %d: %w", s.Name, iter, err)
		}
		// A copy, so a Sampler that changes the request cannot change the history.
		params.Messages = slices.Clone(messages)
		res.Iterations = iter
		if o.Checkpoint != nil {
			o.Checkpoint(Checkpoint{Messages: slices.Clone(messages), Iteration: iter, ToolCalls: res.ToolCalls, LastText: lastText})
		}
		reply, err := o.Sample(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("skill %s: iteration %d: sampling: %w", s.Name, iter, err)
		}
		if reply == nil {
			return nil, fmt.Errorf("skill %s: iteration %d: sampling: no result", s.Name, iter)
		}
		blocks, err := contentBlocks(reply.Content)
		if err != nil {
			return nil, fmt.Errorf("skill %s: iteration %d: sampling: %w", s.Name, iter, err)
		}
		text, uses := split(blocks)
		if text != "" {
			lastText = text
		}
		if len(uses) == 0 {
			res.Output = text
			return res, nil
		}
		if iter == maxIter {
			// Running these calls would be wasted: no turn is left to read them.
			break
		}
		messages = append(messages, mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: blocks})
		results := make([]mcp.Content, 0, len(uses))
		for _, u := range uses {
			if !slices.Contains(offered, u.Name) {
				allowed := "none"
				if len(offered) > 0 {
					allowed = strings.Join(offered, ", ")
				}
				results = append(results, mcp.NewToolResultContent(u.ID, []mcp.Content{
					mcp.NewTextContent(fmt.Sprintf("tool %s is not available to skill %s (allowed: %s)", u.Name, s.Name, allowed)),
				}, true))
				continue
			}
			input, err := toolInput(u.Input)
			if err != nil {
				return nil, fmt.Errorf("skill %s: iteration %d: tool %s: input: %w", s.Name, iter, u.Name, err)
			}
			res.ToolCalls++
			out, err := o.Call(ctx, u.Name, input)
			if err != nil {
				return nil, fmt.Errorf("skill %s: iteration %d: tool %s: %w", s.Name, iter, u.Name, err)
			}
			if out == nil {
				return nil, fmt.Errorf("skill %s: iteration %d: tool %s: no result", s.Name, iter, u.Name)
			}
			results = append(results, toolResult(u.ID, out))
		}
		messages = append(messages, mcp.SamplingMessage{Role: mcp.RoleUser, Content: results})
	}
	res.Partial = true
	res.Output = lastText
	return res, nil
}

func (o *RunOptions) validate() error {
	switch {
	case o.Skill == nil:
		return errors.New("run skill: no skill given")
	case strings.TrimSpace(o.Message) == "":
		return fmt.Errorf("skill %s: message is required: say what the skill should do", o.Skill.Name)
	case o.Sample == nil:
		return fmt.Errorf("skill %s: no sampler: the skill runs on the calling client's model through MCP sampling", o.Skill.Name)
	case o.Call == nil:
		return fmt.Errorf("skill %s: no tool caller given", o.Skill.Name)
	}
	return nil
}

// systemPrompt is a short frame around the skill's instructions. It holds
// nothing from the config: env values must never reach the model.
func systemPrompt(s *Skill) string {
	return fmt.Sprintf("You are running the skill %q as a subagent. Follow its instructions below. "+
		"Use only the tools offered to you. When you are done, answer with your final result as text.\n\n%s",
		s.Name, s.Instructions)
}

// contentBlocks turns a message's content into blocks. Content may be one
// block or a list, typed (what mcp-go's transports produce after
// ParseSamplingContent, or an in-process client) or still generic JSON.
func contentBlocks(content any) ([]mcp.Content, error) {
	switch c := content.(type) {
	case nil:
		return nil, nil
	case []mcp.Content:
		return c, nil
	case mcp.Content:
		return []mcp.Content{c}, nil
	case json.RawMessage:
		var v any
		if err := json.Unmarshal(c, &v); err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
		return contentBlocks(v)
	case map[string]any, []any:
		parsed, err := mcp.ParseSamplingContent(c)
		if err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
		return contentBlocks(parsed)
	}
	return nil, fmt.Errorf("content: unexpected %T", content)
}

// split returns the text of blocks, joined by newlines, and their tool uses
// in order.
func split(blocks []mcp.Content) (string, []mcp.ToolUseContent) {
	var texts []string
	var uses []mcp.ToolUseContent
	for _, b := range blocks {
		switch b := b.(type) {
		case mcp.TextContent:
			texts = append(texts, b.Text)
		case *mcp.TextContent:
			texts = append(texts, b.Text)
		case mcp.ToolUseContent:
			uses = append(uses, b)
		case *mcp.ToolUseContent:
			uses = append(uses, *b)
		}
	}
	return strings.Join(texts, "\n"), uses
}

// toolInput is a tool_use's input as JSON; a missing input is {} since
// tools take an object.
func toolInput(in any) (json.RawMessage, error) {
	switch v := in.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		if len(v) == 0 {
			return json.RawMessage("{}"), nil
		}
		return v, nil
	}
	return json.Marshal(in)
}

func toolResult(id string, out *mcp.CallToolResult) mcp.ToolResultContent {
	content := out.Content
	if content == nil {
		content = []mcp.Content{} // the field is required: [] rather than null
	}
	r := mcp.NewToolResultContent(id, content, out.IsError)
	r.StructuredContent = out.StructuredContent
	r.RawStructuredContent = out.RawStructuredContent
	return r
}

// Wrap renders a result the way Ash's use_skill returns it, telling the
// calling model the user has not seen it and, when it is partial, why.
func Wrap(name string, r *RunResult) string {
	var b strings.Builder
	b.WriteString("<instruction>\n")
	fmt.Fprintf(&b, "This is the result from running the %q skill.\n", name)
	b.WriteString("The user has NOT seen this output. Interpret and include it in your response.\n")
	output := ""
	if r != nil {
		if r.Partial {
			fmt.Fprintf(&b, "The skill stopped at its iteration limit (%d) before finishing, so the output is partial.\n", r.Iterations)
		}
		output = strings.TrimSpace(r.Output)
	}
	b.WriteString("</instruction>\n<output>\n")
	if output != "" {
		b.WriteString(output + "\n")
	}
	b.WriteString("</output>")
	return b.String()
}
