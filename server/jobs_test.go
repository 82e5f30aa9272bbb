package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// askingWork asks the client one sampling question and returns its answer
// as the result.
func askingWork(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error) {
	res, err := ask(ctx, string(mcp.MethodSamplingCreateMessage), json.RawMessage(`{"messages":[],"maxTokens":10}`))
	if err != nil {
		return nil, err
	}
	return mcp.NewToolResultText(string(res)), nil
}

// TestJobResumeBoundToSubject parks a job on its question; only its own
// subject can resume it, and the answer reaches the work.
func TestJobResumeBoundToSubject(t *testing.T) {
	var js jobs
	ctx := context.Background()
	res, err := js.wait(ctx, newJob("alice").run(askingWork))
	if err != nil {
		t.Fatal(err)
	}
	requests, state, pending := callToolResultInput(res)
	if !pending || len(requests) != 1 || state == "" {
		t.Fatalf("want one input request and a state, got %+v", res)
	}
	if j, _ := js.resume(state, "bob"); j != nil {
		t.Fatal("bob resumed alice's job")
	}
	j, _ := js.resume(state, "alice")
	if j == nil {
		t.Fatal("alice could not resume her job")
	}
	if j, _ := js.resume(state, "alice"); j != nil {
		t.Fatal("a job resumed twice")
	}
	var key string
	for k := range requests {
		key = k
	}
	j.deliver(mcp.InputResponses{key: mcp.NewSamplingInputResponse(mcp.CreateMessageResult{Model: "m",
		SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("four")}})})
	res, err = js.wait(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if got := resultText(res); !strings.Contains(got, "four") {
		t.Errorf("the work got %q, want the client's answer", got)
	}
}

// TestJobHoldsNotifications (issue 31, item 5): what the work sends while
// no request waits on its job, before the first starts waiting (a fast
// upstream) or while the job is parked between rounds, is sent on the
// next request that waits, before its answer and in order; nothing is
// dropped.
func TestJobHoldsNotifications(t *testing.T) {
	type reqKey struct{}
	var sent []string // written under j.mu, which relay and wait hold
	var js jobs
	j := newJob("alice")
	note := func(what string) {
		j.relay(func(ctx context.Context) error {
			sent = append(sent, what+" on the "+ctx.Value(reqKey{}).(string))
			return nil
		})
	}
	early := make(chan struct{})
	j.run(func(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error) {
		note("one")
		note("two")
		close(early)
		return askingWork(ctx, ask)
	})
	<-early // both were sent before any request waited on the job
	res, err := js.wait(context.WithValue(context.Background(), reqKey{}, "first request"), j)
	if err != nil {
		t.Fatal(err)
	}
	requests, state, pending := callToolResultInput(res)
	if !pending {
		t.Fatalf("want the job parked on its question, got %+v", res)
	}
	note("three") // while parked
	if j, err = js.resume(state, "alice"); err != nil {
		t.Fatal(err)
	}
	var key string
	for k := range requests {
		key = k
	}
	j.deliver(mcp.InputResponses{key: mcp.NewSamplingInputResponse(mcp.CreateMessageResult{Model: "m",
		SamplingMessage: mcp.SamplingMessage{Role: mcp.RoleAssistant, Content: mcp.NewTextContent("four")}})})
	if res, err = js.wait(context.WithValue(context.Background(), reqKey{}, "second request"), j); err != nil || !strings.Contains(resultText(res), "four") {
		t.Fatalf("the resumed job answered %+v, %v", res, err)
	}
	want := []string{"one on the first request", "two on the first request", "three on the second request"}
	if strings.Join(sent, "; ") != strings.Join(want, "; ") {
		t.Errorf("sent %q, want %q", sent, want)
	}
}

// TestJobParkLimit refuses to park more than maxParkedPerSub jobs of one
// subject, and does not count another subject's.
func TestJobParkLimit(t *testing.T) {
	var js jobs
	ctx := context.Background()
	for range maxParkedPerSub {
		if res, _ := js.wait(ctx, newJob("alice").run(askingWork)); res.IsError {
			t.Fatalf("parking failed early: %s", resultText(res))
		}
	}
	res, _ := js.wait(ctx, newJob("alice").run(askingWork))
	if !res.IsError || !strings.Contains(resultText(res), "rate_limited") {
		t.Errorf("the job over the limit = %q, want rate_limited", resultText(res))
	}
	if res, _ := js.wait(ctx, newJob("bob").run(askingWork)); res.IsError {
		t.Errorf("bob's job was refused: %s", resultText(res))
	}
}

func callToolResultInput(r *mcp.CallToolResult) (mcp.InputRequests, string, bool) {
	b, _ := json.Marshal(r)
	var v struct {
		InputRequests mcp.InputRequests `json:"inputRequests"`
		RequestState  string            `json:"requestState"`
		ResultType    string            `json:"resultType"`
	}
	json.Unmarshal(b, &v)
	return v.InputRequests, v.RequestState, v.ResultType == "input_required"
}
