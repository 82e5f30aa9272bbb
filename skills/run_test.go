package skills

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// script is a Sampler that answers with canned results in turn (repeating
// the last one) and records every request.
type script struct {
	mu      sync.Mutex
	replies []*mcp.CreateMessageResult
	err     error // returned instead of a reply on request failAt (1-based)
	failAt  int
	reqs    []mcp.CreateMessageParams
}

func (s *script) sample(_ context.Context, p mcp.CreateMessageParams) (*mcp.CreateMessageResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.Messages = slices.Clone(p.Messages) // as sent, whatever happens to p later
	s.reqs = append(s.reqs, p)
	n := len(s.reqs)
	if s.err != nil && n == s.failAt {
		return nil, s.err
	}
	return s.replies[min(n, len(s.replies))-1], nil
}

type call struct {
	tool  string
	input string
}

// recorder is a Caller that records calls and answers with result.
type recorder struct {
	mu     sync.Mutex
	calls  []call
	result func(tool string) *mcp.CallToolResult
}

func (r *recorder) call(_ context.Context, tool string, input json.RawMessage) (*mcp.CallToolResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{tool, string(input)})
	if r.result != nil {
		return r.result(tool), nil
	}
	return mcp.NewToolResultText("result of " + tool), nil
}

func reply(content any) *mcp.CreateMessageResult {
	r := &mcp.CreateMessageResult{Model: "test-model", StopReason: "endTurn"}
	r.Role = mcp.RoleAssistant
	r.Content = content
	return r
}

func toolUse(id, name string, input any) *mcp.CreateMessageResult {
	r := reply([]mcp.Content{mcp.NewTextContent("calling " + name), mcp.NewToolUseContent(id, name, input)})
	r.StopReason = "toolUse"
	return r
}

func testSkill() *Skill {
	return &Skill{Name: "research", Description: "Research things", Model: "haiku",
		Instructions: "Search the web and summarise with sources.", MaxIterations: DefaultMaxIterations,
		EnvValues: map[string]string{"API_KEY": "sekrit-value"}}
}

func tools(names ...string) []mcp.Tool {
	var out []mcp.Tool
	for _, n := range names {
		out = append(out, mcp.NewTool(n, mcp.WithDescription("tool "+n)))
	}
	return out
}

func opts(s *script, r *recorder) RunOptions {
	return RunOptions{Skill: testSkill(), Message: "find Python 3.13 async features",
		Tools: tools("web_search", "web_fetch"), Sample: s.sample, Call: r.call}
}

// blocksOf reads a message's content as blocks, failing the test otherwise.
func blocksOf(t *testing.T, m mcp.SamplingMessage) []mcp.Content {
	t.Helper()
	b, err := contentBlocks(m.Content)
	if err != nil {
		t.Fatalf("message content: %v", err)
	}
	return b
}

func TestRunDirectAnswer(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{reply(mcp.NewTextContent("Python 3.13 adds X."))}}
	r := &recorder{}
	o := opts(s, r)
	o.Context = "User is upgrading a Django app"
	o.Model = "sonnet" // overrides the skill's haiku
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Output != "Python 3.13 adds X." || res.Iterations != 1 || res.Partial || res.ToolCalls != 0 {
		t.Errorf("result = %+v", res)
	}
	if len(r.calls) != 0 {
		t.Errorf("calls = %v, want none", r.calls)
	}
	if len(s.reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(s.reqs))
	}
	p := s.reqs[0]
	if !strings.Contains(p.SystemPrompt, "Search the web and summarise with sources.") ||
		!strings.Contains(p.SystemPrompt, `"research"`) {
		t.Errorf("system prompt = %q", p.SystemPrompt)
	}
	if strings.Contains(p.SystemPrompt, "sekrit-value") {
		t.Errorf("system prompt leaks an env value: %q", p.SystemPrompt)
	}
	if p.ModelPreferences == nil || len(p.ModelPreferences.Hints) != 1 || p.ModelPreferences.Hints[0].Name != "sonnet" {
		t.Errorf("model preferences = %+v", p.ModelPreferences)
	}
	if p.MaxTokens != DefaultMaxTokens {
		t.Errorf("max tokens = %d", p.MaxTokens)
	}
	if len(p.Tools) != 2 || p.Tools[0].Name != "web_search" || p.ToolChoice == nil {
		t.Errorf("tools = %v, choice = %v", p.Tools, p.ToolChoice)
	}
	if len(p.Messages) != 1 || p.Messages[0].Role != mcp.RoleUser {
		t.Fatalf("messages = %+v", p.Messages)
	}
	b := blocksOf(t, p.Messages[0])
	want := "find Python 3.13 async features\n\nContext:\nUser is upgrading a Django app"
	if len(b) != 1 || b[0].(mcp.TextContent).Text != want {
		t.Errorf("first message = %+v, want text %q", b, want)
	}
}

func TestRunSkillModelAndNoTools(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{reply(mcp.NewTextContent("ok"))}}
	o := opts(s, &recorder{})
	o.Tools = nil
	o.MaxTokens = 100
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	p := s.reqs[0]
	if p.ModelPreferences == nil || p.ModelPreferences.Hints[0].Name != "haiku" {
		t.Errorf("model preferences = %+v, want the skill's haiku", p.ModelPreferences)
	}
	if p.Tools != nil || p.ToolChoice != nil || p.MaxTokens != 100 {
		t.Errorf("tools = %v, choice = %v, max tokens = %d", p.Tools, p.ToolChoice, p.MaxTokens)
	}
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), `"tools"`) || strings.Contains(string(raw), `"toolChoice"`) {
		t.Errorf("request JSON has tools: %s", raw)
	}
	// Without any model, no preferences are sent.
	o.Skill.Model = ""
	s.reqs = nil
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if s.reqs[0].ModelPreferences != nil {
		t.Errorf("model preferences = %+v, want none", s.reqs[0].ModelPreferences)
	}
}

func TestRunToolThenAnswer(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{
		toolUse("tu1", "web_search", map[string]any{"query": "python 3.13"}),
		reply([]mcp.Content{mcp.NewTextContent("Found it."), mcp.NewTextContent("Sources: a, b")}),
	}}
	r := &recorder{}
	res, err := Run(context.Background(), opts(s, r))
	if err != nil {
		t.Fatal(err)
	}
	if res.Output != "Found it.\nSources: a, b" || res.Iterations != 2 || res.ToolCalls != 1 || res.Partial {
		t.Errorf("result = %+v", res)
	}
	if len(r.calls) != 1 || r.calls[0] != (call{"web_search", `{"query":"python 3.13"}`}) {
		t.Errorf("calls = %+v", r.calls)
	}
	if len(s.reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(s.reqs))
	}
	h := s.reqs[1].Messages
	if len(h) != 3 || h[1].Role != mcp.RoleAssistant || h[2].Role != mcp.RoleUser {
		t.Fatalf("history = %+v", h)
	}
	asst := blocksOf(t, h[1])
	if len(asst) != 2 {
		t.Fatalf("assistant blocks = %+v, want text and tool_use", asst)
	}
	if u, ok := asst[1].(mcp.ToolUseContent); !ok || u.ID != "tu1" || u.Name != "web_search" {
		t.Errorf("assistant block 2 = %+v", asst[1])
	}
	results := blocksOf(t, h[2])
	if len(results) != 1 {
		t.Fatalf("tool results = %+v", results)
	}
	tr, ok := results[0].(mcp.ToolResultContent)
	if !ok || tr.ToolUseID != "tu1" || tr.IsError || tr.Type != mcp.ContentTypeToolResult {
		t.Fatalf("tool result = %+v", results[0])
	}
	if len(tr.Content) != 1 || tr.Content[0].(mcp.TextContent).Text != "result of web_search" {
		t.Errorf("tool result content = %+v", tr.Content)
	}
}

func TestRunSamplerCannotChangeHistory(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{
		toolUse("tu1", "web_search", nil),
		reply(mcp.NewTextContent("done")),
	}}
	tamper := func(ctx context.Context, p mcp.CreateMessageParams) (*mcp.CreateMessageResult, error) {
		r, err := s.sample(ctx, p) // records the request as sent
		p.Messages[0].Content = mcp.NewTextContent("tampered")
		return r, err
	}
	o := opts(s, &recorder{})
	o.Sample = tamper
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if b := blocksOf(t, s.reqs[1].Messages[0]); b[0].(mcp.TextContent).Text != o.Message {
		t.Errorf("second request's first message = %+v, want the caller's message", b)
	}
}

func TestRunToolNotOffered(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{
		toolUse("tu1", "bash", map[string]any{"cmd": "env"}),
		reply(mcp.NewTextContent("I could not run bash.")),
	}}
	r := &recorder{}
	res, err := Run(context.Background(), opts(s, r))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.calls) != 0 {
		t.Errorf("Caller called for a tool not offered: %+v", r.calls)
	}
	if res.ToolCalls != 0 || res.Output != "I could not run bash." {
		t.Errorf("result = %+v", res)
	}
	tr := blocksOf(t, s.reqs[1].Messages[2])[0].(mcp.ToolResultContent)
	want := "tool bash is not available to skill research (allowed: web_search, web_fetch)"
	if !tr.IsError || tr.ToolUseID != "tu1" || len(tr.Content) != 1 || tr.Content[0].(mcp.TextContent).Text != want {
		t.Errorf("tool result = %+v, want error %q", tr, want)
	}
}

func TestRunIterationLimit(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{
		toolUse("tu1", "web_search", map[string]any{"query": "a"}),
		toolUse("tu2", "web_fetch", map[string]any{"url": "b"}),
	}}
	r := &recorder{}
	o := opts(s, r)
	o.Skill.MaxIterations = 2
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Iterations != 2 || !res.Partial || len(s.reqs) != 2 {
		t.Errorf("result = %+v after %d requests", res, len(s.reqs))
	}
	if res.Output != "calling web_fetch" {
		t.Errorf("output = %q, want the last text", res.Output)
	}
	// The last turn's tool use is not run: nothing would read its result.
	if res.ToolCalls != 1 || len(r.calls) != 1 {
		t.Errorf("tool calls = %d, calls = %+v", res.ToolCalls, r.calls)
	}
	w := Wrap("research", res)
	if !strings.Contains(w, "iteration limit (2)") || !strings.Contains(w, "partial") {
		t.Errorf("Wrap does not say the output is partial:\n%s", w)
	}
	if !strings.Contains(w, "<output>\ncalling web_fetch\n</output>") {
		t.Errorf("Wrap output:\n%s", w)
	}
}

func TestRunDefaultIterations(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{toolUse("tu", "web_search", nil)}}
	r := &recorder{}
	o := opts(s, r)
	o.Skill.MaxIterations = 0
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Iterations != DefaultMaxIterations || !res.Partial {
		t.Errorf("result = %+v", res)
	}
	if len(r.calls) == 0 || r.calls[0].input != "{}" {
		t.Errorf("calls = %+v, want input {} for a missing input", r.calls)
	}
}

func TestRunDenialContinues(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{
		toolUse("tu1", "web_fetch", map[string]any{"url": "http://x"}),
		reply(mcp.NewTextContent("Fetching was denied.")),
	}}
	r := &recorder{result: func(string) *mcp.CallToolResult {
		return mcp.NewToolResultError("denied: rye.execute.tool.web_fetch not granted")
	}}
	res, err := Run(context.Background(), opts(s, r))
	if err != nil {
		t.Fatal(err)
	}
	if res.Iterations != 2 || res.Output != "Fetching was denied." || res.ToolCalls != 1 {
		t.Errorf("result = %+v", res)
	}
	tr := blocksOf(t, s.reqs[1].Messages[2])[0].(mcp.ToolResultContent)
	if !tr.IsError || tr.Content[0].(mcp.TextContent).Text != "denied: rye.execute.tool.web_fetch not granted" {
		t.Errorf("tool result = %+v", tr)
	}
}

// A reply decoded from JSON without mcp.ParseSamplingContent has generic
// content; Run still finds its blocks.
func TestRunGenericContent(t *testing.T) {
	var use, final mcp.CreateMessageResult
	if err := json.Unmarshal([]byte(`{"role":"assistant","model":"m","content":[
		{"type":"tool_use","id":"tu1","name":"web_search","input":{"query":"q"}}]}`), &use); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"role":"assistant","model":"m","content":{"type":"text","text":"done"}}`), &final); err != nil {
		t.Fatal(err)
	}
	s := &script{replies: []*mcp.CreateMessageResult{&use, &final}}
	r := &recorder{}
	res, err := Run(context.Background(), opts(s, r))
	if err != nil {
		t.Fatal(err)
	}
	if res.Output != "done" || len(r.calls) != 1 || r.calls[0].input != `{"query":"q"}` {
		t.Errorf("result = %+v, calls = %+v", res, r.calls)
	}
}

func TestRunOptionErrors(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{reply(mcp.NewTextContent("x"))}}
	r := &recorder{}
	for _, tc := range []struct {
		name string
		mod  func(*RunOptions)
		want string
	}{
		{"no skill", func(o *RunOptions) { o.Skill = nil }, "no skill"},
		{"no message", func(o *RunOptions) { o.Message = "  " }, "message is required"},
		{"no sampler", func(o *RunOptions) { o.Sample = nil }, "no sampler"},
		{"no caller", func(o *RunOptions) { o.Call = nil }, "no tool caller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts(s, r)
			tc.mod(&o)
			res, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || res != nil {
				t.Errorf("Run = %v, %v; want error containing %q", res, err, tc.want)
			}
		})
	}
	if len(s.reqs) != 0 {
		t.Errorf("sampled %d times with invalid options", len(s.reqs))
	}
}

func TestRunSamplingError(t *testing.T) {
	boom := errors.New("client refused sampling")
	s := &script{replies: []*mcp.CreateMessageResult{toolUse("tu1", "web_search", nil)}, err: boom, failAt: 2}
	_, err := Run(context.Background(), opts(s, &recorder{}))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want it to wrap %v", err, boom)
	}
	if want := "skill research: iteration 2: sampling: client refused sampling"; err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}
}

func TestRunCallerError(t *testing.T) {
	s := &script{replies: []*mcp.CreateMessageResult{toolUse("tu1", "web_search", nil)}}
	o := opts(s, &recorder{})
	o.Call = func(ctx context.Context, _ string, _ json.RawMessage) (*mcp.CallToolResult, error) {
		return nil, context.Canceled
	}
	_, err := Run(context.Background(), o)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "iteration 1: tool web_search") {
		t.Errorf("err = %v", err)
	}
	if len(s.reqs) != 1 {
		t.Errorf("%d requests after the caller failed, want 1", len(s.reqs))
	}
}

func TestWrap(t *testing.T) {
	got := Wrap("research", &RunResult{Output: "Python 3.13 introduces...\n", Iterations: 3})
	want := "<instruction>\nThis is the result from running the \"research\" skill.\n" +
		"The user has NOT seen this output. Interpret and include it in your response.\n" +
		"</instruction>\n<output>\nPython 3.13 introduces...\n</output>"
	if got != want {
		t.Errorf("Wrap =\n%s\nwant\n%s", got, want)
	}
}

// A run checkpointed before its second sampling request, carried as JSON
// (as a sealed requestState carries it) and resumed by a second Run, ends
// as the uninterrupted run does: same history sent, same counters, no
// tool call repeated.
func TestRunResumeFromCheckpoint(t *testing.T) {
	replies := []*mcp.CreateMessageResult{
		toolUse("tu1", "web_search", map[string]any{"query": "python 3.13"}),
		reply([]mcp.Content{mcp.NewTextContent("Found it.")}),
	}
	whole := &script{replies: replies}
	want, err := Run(context.Background(), opts(whole, &recorder{}))
	if err != nil {
		t.Fatal(err)
	}

	var points []Checkpoint
	first := &script{replies: replies[:1], err: errors.New("the client went away"), failAt: 2}
	o := opts(first, &recorder{})
	o.Checkpoint = func(c Checkpoint) { points = append(points, c) }
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("the interrupted run did not fail")
	}
	if len(points) != 2 || points[1].Iteration != 2 || points[1].ToolCalls != 1 || points[1].LastText != "calling web_search" {
		t.Fatalf("checkpoints = %+v", points)
	}
	b, err := json.Marshal(points[1])
	if err != nil {
		t.Fatal(err)
	}
	var cp Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}

	rest := &script{replies: replies[1:]}
	r := &recorder{}
	o = opts(rest, r)
	o.Resume = &cp
	got, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *want || len(r.calls) != 0 {
		t.Errorf("resumed = %+v with calls %v, want %+v and no call", got, r.calls, want)
	}
	// The same JSON, key order aside (the resumed history is maps).
	var sent, orig any
	b1, _ := json.Marshal(rest.reqs[0].Messages)
	b2, _ := json.Marshal(whole.reqs[1].Messages)
	json.Unmarshal(b1, &sent)
	json.Unmarshal(b2, &orig)
	if !reflect.DeepEqual(sent, orig) {
		t.Errorf("the resumed request's history differs:\n%s\n%s", sent, orig)
	}

	o.Resume = &Checkpoint{Iteration: 99, Messages: cp.Messages}
	if _, err := Run(context.Background(), o); err == nil {
		t.Error("resumed past max_iterations")
	}
}
