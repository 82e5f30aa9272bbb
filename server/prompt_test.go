package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/capgate/capgate/internal/conformance"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/token"
)

// TestPromptInputRounds: an upstream prompt that needs the user's input
// first (SEP-2322) is relayed in rounds to a 2026-07-28 client. The
// client gets the upstream's input request as it came and a state of
// capgate's own, sealed: the upstream's state is never shown, it goes
// back to the upstream as it came (the fixture completes only then), and
// the state is used once, by its own subject, unchanged.
func TestPromptInputRounds(t *testing.T) {
	fx := conformance.StartFixture(t)
	url := openConformance(t, fx, "rye.fetch.directive.mcp.cf.*")
	alice, bob := mint(t, token.Claims{Sub: "alice"}), mint(t, token.Claims{Sub: "bob"})
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}`
	type reply struct {
		Result struct {
			ResultType    string                     `json:"resultType"`
			RequestState  string                     `json:"requestState"`
			InputRequests map[string]json.RawMessage `json:"inputRequests"`
			Messages      []json.RawMessage          `json:"messages"`
		} `json:"result"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	get := func(tok, state string) (reply, string) {
		t.Helper()
		params := `"name":"test_prompt_needs_input",` + meta
		if state != "" {
			params += `,"requestState":` + strconv.Quote(state) + `,"inputResponses":{"context":{"action":"accept","content":{"context":"the test"}}}`
		}
		st, _, body := testkit.PostMCPMethod(t, url, tok, "prompts/get", "test_prompt_needs_input",
			`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{`+params+`}}`)
		if st != http.StatusOK {
			t.Fatalf("prompts/get: %d %s", st, body)
		}
		var r reply
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("prompts/get: %v: %s", err, body)
		}
		return r, string(body)
	}

	first, body := get(alice, "")
	if first.Result.ResultType != "input_required" || first.Result.InputRequests["context"] == nil {
		t.Fatalf("first round: want the upstream's input request under its key, got %s", body)
	}
	state := first.Result.RequestState
	if !strings.HasPrefix(state, statePrefix) || strings.Contains(body, "fixture-prompt-state") {
		t.Fatalf("the client got the upstream's state, or no sealed one: %s", body)
	}
	// Changed, or another subject's: refused before any use.
	i, c := len(state)/2, "A"
	if state[i] == 'A' {
		c = "B"
	}
	changed := state[:i] + c + state[i+1:]
	if r, body := get(alice, changed); r.Error == nil || !strings.Contains(r.Error.Message, "not one capgate sealed") {
		t.Errorf("a changed state: %s", body)
	}
	if r, body := get(bob, state); r.Error == nil || !strings.Contains(r.Error.Message, "unknown or expired") {
		t.Errorf("bob with alice's state: %s", body)
	}
	// Answered: the upstream got its own state back and completes.
	done, body := get(alice, state)
	if done.Error != nil || done.Result.ResultType == "input_required" || len(done.Result.Messages) != 1 ||
		!strings.Contains(string(done.Result.Messages[0]), `Context: {\"context\":\"the test\"}`) {
		t.Fatalf("second round: %s", body)
	}
	if r, body := get(alice, state); r.Error == nil || !strings.Contains(r.Error.Message, "already used") {
		t.Errorf("a replayed state: %s", body)
	}
}
