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
