package server

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/skills"
	"github.com/capgate/capgate/tool"
)

// UseSkill is the name of the tool that runs a skill.
const UseSkill = "use_skill"

// Skills are served two ways: each enabled skill is an MCP prompt (its
// instructions), and use_skill runs one as Ash does, in an isolated loop
// on the calling client's model through MCP sampling. The loop sees only
// the skill's allowed tools, and every inner call goes through the router
// with the skill's grants intersected with the caller's.

type skillSet struct {
	enabled  map[string]*skills.Skill
	problems map[string]string // why a known skill is not enabled
}

// SetSkills serves the enabled skills; problems (skill name → message)
// explain a use_skill of a skill that is there but not enabled.
func (m *MCP) SetSkills(enabled []*skills.Skill, problems map[string]string) {
	set := skillSet{enabled: map[string]*skills.Skill{}, problems: problems}
	var prompts []mcpserver.ServerPrompt
	for _, s := range enabled {
		set.enabled[s.Name] = s
		prompts = append(prompts, mcpserver.ServerPrompt{
			Prompt:  mcp.NewPrompt(s.Name, mcp.WithPromptDescription(s.Description)),
			Handler: m.skillPrompt(s),
		})
	}
	m.mu.Lock()
	m.skills = set
	m.listed = nil // the tool list gains or loses use_skill
	m.mu.Unlock()
	m.relay.mu.Lock()
	m.relay.skills = prompts
	m.relay.mu.Unlock()
	m.syncRelay()
	m.sync(m.reg().Snapshot())
}

func (m *MCP) skillPrompt(s *skills.Skill) mcpserver.PromptHandlerFunc {
	return func(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		if err := m.rt().Fetch(CallerFrom(ctx), permissions.Directive, s.Name, "prompt "+s.Name, protocolOf(ctx)); err != nil {
			return nil, fmt.Errorf("%s", tool.ErrorMessage(err))
		}
		return mcp.NewGetPromptResult(s.Description, []mcp.PromptMessage{
			mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(s.Instructions)),
		}), nil
	}
}

// useSkillTool is use_skill as listed to c: its description names the
// skills c may run.
func (m *MCP) useSkillTool(ctx context.Context, c *router.Caller) (mcp.Tool, bool) {
	if ok, _ := clientSampling(ctx); !ok {
		return mcp.Tool{}, false // its skills run on the client's model, which this client does not lend
	}
	m.mu.Lock()
	set := m.skills
	m.mu.Unlock()
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(set.enabled)) {
		if m.rt().May(c, permissions.Execute, permissions.Directive, name) {
			lines = append(lines, "- "+name+": "+oneLine(set.enabled[name].Description))
		}
	}
	if len(lines) == 0 {
		return mcp.Tool{}, false
	}
	t := useSkillBase()
	t.Description += "\n\nSkills:\n" + strings.Join(lines, "\n")
	return t, true
}

func useSkillBase() mcp.Tool {
	f, readOnly, t := false, false, true
	return mcp.Tool{
		Name: UseSkill,
		Description: "Run a skill: a subagent with its own instructions and a restricted set of tools, " +
			"on your client's model through MCP sampling. Pass what it should do and the context it needs; " +
			"it does not see this conversation. Its result has not been shown to the user.",
		RawInputSchema: json.RawMessage(`{"type":"object","properties":{` +
			`"skill":{"type":"string","description":"the skill's name"},` +
			`"message":{"type":"string","description":"what the skill should do"},` +
			`"context":{"type":"string","description":"what the skill needs to know from this conversation"}},` +
			`"required":["skill","message"],"additionalProperties":false}`),
		Annotations: mcp.ToolAnnotation{Title: "Use a skill", ReadOnlyHint: &readOnly, DestructiveHint: &t,
			IdempotentHint: &f, OpenWorldHint: &t},
	}
}

// useSkill runs a skill for the caller, as a job: each sampling request
// goes to the calling client, each inner call through the router.
func (m *MCP) useSkill(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := CallerFrom(ctx)
	if c == nil {
		return mcpconv.Denial(tool.Errorf(tool.CodeTokenInvalid, "no verified caller")), nil
	}
	if req.Params.RequestState != "" {
		return m.resume(ctx, c, req)
	}
	var in struct {
		Skill   string `json:"skill"`
		Message string `json:"message"`
		Context string `json:"context"`
	}
	if err := json.Unmarshal(mcpconv.RawArguments(req), &in); err != nil {
		return mcpconv.Denial(tool.Errorf(tool.CodeInvalidInput, "use_skill input: %v", err)), nil
	}
	if strings.TrimSpace(in.Message) == "" {
		return mcpconv.Denial(tool.Errorf(tool.CodeInvalidInput, "use_skill input.message: is required")), nil
	}
	proto := protocolOf(ctx)
	run, err := m.rt().BeginSkill(c, in.Skill, proto)
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	sampling, samplingTools := clientSampling(ctx)
	if !sampling {
		err := &tool.Error{Code: tool.CodeInvalidInput, Message: UseSkill + " " + noSampling,
			Hint: "connect with a client that declares the sampling capability"}
		run.Deny(err)
		return mcpconv.Denial(err), nil
	}
	// The spec forbids tools in a request to a client that did not
	// declare sampling.tools: such a skill runs without them.
	st := &skillState{Name: in.Skill, Message: in.Message, Context: in.Context, Tools: samplingTools, Began: time.Now().UnixMilli()}
	return m.runSkill(ctx, c, run, proto, st, nil)
}

// continueSkill goes on with the use_skill run st carries, begun here or
// on another replica, from its model's answer in responses. The caller's
// access to the skill is decided again, as for a new run.
func (m *MCP) continueSkill(ctx context.Context, c *router.Caller, st *requestState, responses mcp.InputResponses) (*mcp.CallToolResult, error) {
	sk := *st.Skill
	proto := protocolOf(ctx)
	run, err := m.rt().BeginSkill(c, sk.Name, proto)
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	run.BeganAt(time.UnixMilli(sk.Began))
	r, ok := responses[sk.Key]
	if ok {
		err = r.DecodeFor(mcp.MethodSamplingCreateMessage)
	}
	if !ok || err != nil || r.Sampling == nil {
		err := tool.Errorf(tool.CodeInvalidInput, "inputResponses[%q]: want the model's answer for skill %s (sampling/createMessage)", sk.Key, sk.Name)
		run.Deny(err)
		return mcpconv.Denial(err), nil
	}
	return m.runSkill(ctx, c, run, proto, &sk, r.Sampling)
}

// runSkill decides c's access to the skill st names, as for a new run,
// and runs it as a job (skillJob), offering its model the skill's tools
// when st says the client takes them.
func (m *MCP) runSkill(ctx context.Context, c *router.Caller, run *router.SkillRun, proto string,
	st *skillState, first *mcp.CreateMessageResult) (*mcp.CallToolResult, error) {
	s, scope, err := m.skillAccess(c, st.Name)
	if err != nil {
		run.Deny(err)
		return mcpconv.Denial(err), nil
	}
	var tools []mcp.Tool
	if st.Tools {
		tools = m.skillTools(c, s, scope)
	}
	return m.jobs.wait(ctx, m.skillJob(c, run, s, scope, tools, proto, st, first))
}

// skillJob runs skill s for c as a job: from the start, or with first (the
// model's answer to the request st was checkpointed at) from st's
// checkpoint. The job keeps st at each sampling request, for its
// requestState.
func (m *MCP) skillJob(c *router.Caller, run *router.SkillRun, s *skills.Skill, scope *router.Scope, tools []mcp.Tool,
	proto string, st *skillState, first *mcp.CreateMessageResult) *job {
	j := newJob(c.Sub)
	j.skill = st
	var resume *skills.Checkpoint
	iterations, toolCalls := 0, 0
	if first != nil {
		at := st.At
		resume = &at
		iterations, toolCalls = at.Iteration-1, at.ToolCalls
		// Keys go on from the run's: the model's request of iteration i is
		// q<i> on whichever replica asks it.
		j.seq = at.Iteration
	}
	in := struct{ Message, Context string }{st.Message, st.Context}
	return j.run(func(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error) {
		res, err := skills.Run(ctx, skills.RunOptions{
			Skill: s, Message: in.Message, Context: in.Context, Model: s.Model, Tools: tools, Resume: resume,
			Checkpoint: func(at skills.Checkpoint) {
				j.mu.Lock()
				j.skill.At = at
				j.mu.Unlock()
			},
			Sample: func(ctx context.Context, p mcp.CreateMessageParams) (*mcp.CreateMessageResult, error) {
				iterations++
				if first != nil {
					out := first
					first = nil
					return out, nil
				}
				b, err := json.Marshal(p)
				if err != nil {
					return nil, err
				}
				raw, err := ask(ctx, string(mcp.MethodSamplingCreateMessage), b)
				if err != nil {
					return nil, err
				}
				var out mcp.CreateMessageResult
				if err := json.Unmarshal(raw, &out); err != nil {
					return nil, fmt.Errorf("the client's sampling result: %w", err)
				}
				return &out, nil
			},
			Call: func(ctx context.Context, name string, input json.RawMessage) (*mcp.CallToolResult, error) {
				toolCalls++
				res, err := m.rt().Call(ctx, c, router.Request{Tool: name, Input: input, Scope: scope,
					Protocol: proto + " skill:" + s.Name})
				if err != nil {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					return mcpconv.Denial(err), nil
				}
				return mcpconv.ToResult(res)
			},
		})
		if err != nil && j.handedOn.Load() {
			run.HandedOn()
			return nil, ctx.Err() // nobody waits here for the run
		}
		if err != nil {
			err := tool.Wrap(err, tool.CodeBackendUnavailable, "%v", err)
			run.End(iterations, toolCalls, false, err)
			return mcpconv.Denial(err), nil
		}
		run.End(res.Iterations, res.ToolCalls, res.Partial, nil)
		out := mcp.NewToolResultText(skills.Wrap(s.Name, res))
		out.IsError = res.Partial // Ash: a partial result carries the error flag
		out.StructuredContent = map[string]any{"skill": s.Name, "iterations": res.Iterations,
			"tool_calls": res.ToolCalls, "partial": res.Partial}
		return out, nil
	})
}

// skillAccess decides whether c may run the skill name: it must be
// enabled, visible (rye.fetch.directive.<name>, else it reads as
// missing), runnable (rye.execute.directive.<name>), and its access rules
// must admit c's chat. It returns the scope of the skill's inner calls.
func (m *MCP) skillAccess(c *router.Caller, name string) (*skills.Skill, *router.Scope, error) {
	m.mu.Lock()
	set := m.skills
	m.mu.Unlock()
	notFound := tool.Errorf(tool.CodeNotFound, "no skill %q", name)
	if !m.rt().May(c, permissions.Fetch, permissions.Directive, name) {
		return nil, nil, notFound
	}
	s, ok := set.enabled[name]
	if !ok {
		if why, known := set.problems[name]; known {
			return nil, nil, tool.Errorf(tool.CodeBackendUnavailable, "skill %s is not available: %s", name, why)
		}
		return nil, nil, notFound
	}
	required := permissions.Required(permissions.Execute, permissions.Directive, name)
	if !m.rt().May(c, permissions.Execute, permissions.Directive, name) {
		return nil, nil, &tool.Error{Code: tool.CodePermissionDenied, Gate: router.GateCapability, Required: required,
			Message: required + " is not granted", Hint: "grant " + required + " to the caller (token caps or [policy] grants)"}
	}
	chat := c.ChatType()
	allowed := s.ChatTypes
	if s.Sensitive && len(allowed) == 0 {
		allowed = []string{"private"} // sensitive without access.chat_types: private only (Ash)
	}
	if len(allowed) > 0 && !slices.ContainsFunc(allowed, func(a string) bool { return chat != "" && strings.EqualFold(a, chat) }) {
		in := "a chat of unknown type"
		if chat != "" {
			in = "a " + chat + " chat"
		}
		return nil, nil, &tool.Error{Code: tool.CodeAccessDenied, Gate: router.GateChat,
			Message: fmt.Sprintf("skill %s is only allowed in %s chats, not in %s", name, strings.Join(allowed, " or "), in),
			Hint:    "use it from a " + strings.Join(allowed, " or ") + " chat"}
	}
	// Ash refuses a skill whose declared capabilities the caller lacks
	// before its model runs: the skill's grants only narrow the caller's.
	for _, cp := range s.Capabilities {
		id := "bridge:" + strings.Replace(cp, ".", ":", 1) + ".*"
		if !m.rt().May(c, permissions.Execute, permissions.Tool, id) {
			req := permissions.Required(permissions.Execute, permissions.Tool, id)
			return nil, nil, &tool.Error{Code: tool.CodePermissionDenied, Gate: router.GateCapability, Required: req,
				Message: fmt.Sprintf("skill %s needs the capability %s: %s is not granted", name, cp, req),
				Hint:    "grant " + req + " to the caller (token caps or [policy] grants)"}
		}
	}
	if len(s.AllowChatIDs) > 0 && !slices.Contains(s.AllowChatIDs, c.ChatID()) {
		return nil, nil, &tool.Error{Code: tool.CodeAccessDenied, Gate: router.GateChat,
			Message: fmt.Sprintf("skill %s is not allowed in this chat", name),
			Hint:    fmt.Sprintf("add the chat id to [skills.%s] allow_chat_ids", name)}
	}
	// Allowed tools given by exposed name grant the tools they name.
	gs := s.Grants()
	snap := m.reg().Snapshot()
	for _, n := range s.ToolNames() {
		if d, ok := snap.ByExposedName(n); ok {
			gs = append(gs, permissions.Required(permissions.Execute, permissions.Tool, d.ID))
		}
	}
	if len(gs) == 0 && len(s.AllowedTools) == 0 {
		// A skill that declares no tools, capabilities or permissions
		// inherits the caller's (Ash: all of the caller's tools; Rye:
		// the caller's capabilities). The scope still intersects, so it
		// never widens, and tiers still need the skill's acknowledge.
		gs = []string{"*"}
	}
	grants, err := permissions.NewSet(gs...)
	if err != nil {
		return nil, nil, tool.Errorf(tool.CodeBackendUnavailable, "skill %s: its grants: %v", name, err)
	}
	return s, &router.Scope{Name: name, Grants: grants, Acknowledge: s.Acknowledge, Secrets: s.EnvValues}, nil
}

// skillTools are the tools offered to the skill's model: its allowed
// tools that the caller, narrowed to the skill, may see; with no
// allowed_tools, every tool the narrowed caller may see.
func (m *MCP) skillTools(c *router.Caller, s *skills.Skill, scope *router.Scope) []mcp.Tool {
	var out []mcp.Tool
	for _, d := range m.rt().List(c, scope, registry.Filter{}) {
		if len(s.AllowedTools) == 0 || slices.Contains(s.AllowedTools, d.ExposedName) || slices.Contains(s.AllowedTools, d.ID) {
			out = append(out, mcpTool(d))
		}
	}
	return out
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// noSampling says why use_skill is not offered to a client.
const noSampling = "needs a client that supports sampling: its skills run on the client's model, and this client did not declare capabilities.sampling"

// clientSampling reports whether the client declared sampling, and
// sampling with tools.
var clientSampling = mcpconv.ClientSampling

// withoutUseSkill is a skill prompt's description for a client that
// cannot sample: the prompt is there, use_skill is not, and this says why.
func withoutUseSkill(desc string) string {
	note := "(" + UseSkill + " " + noSampling + "; this prompt gives the skill's instructions to use directly.)"
	if desc == "" {
		return note
	}
	return desc + " " + note
}
