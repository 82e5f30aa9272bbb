package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	capgate "github.com/capgate/capgate"
	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/sources/bridge"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

func TestMain(m *testing.M) {
	testkit.Programs(testkit.BridgeFixture, testkit.MCPFixture)
	testkit.Main(m)
}

// env is a router over real sources: the extension packs of sources/ext,
// the bridge fixture and the MCP fixture as subprocesses, a SQLite store
// and an audit file in a temp dir.
type env struct {
	r         *Router
	st        *store.Store
	log       *audit.Log
	auditPath string
	secret    []byte
	tokens    []string // every token minted, to search the audit file for
}

const secretText = "router-test-secret-0123456789abcdef"

func newEnv(t *testing.T, policy Policy) *env {
	t.Helper()
	packs, _ := filepath.Abs("../sources/ext/testdata/packs")
	dir := t.TempDir()
	e := &env{secret: []byte(secretText), auditPath: filepath.Join(dir, "audit.jsonl")}
	reg, err := sources.Build(context.Background(), sources.BuildOptions{
		ExtPaths: []string{packs},
		Bridges:  []sources.Bridge{{Options: bridge.Options{Namespace: "gog", Command: []string{testkit.Build(t, testkit.BridgeFixture)}}}},
		MCP: []sources.MCPServer{{
			Options: mcp.Options{Name: "fx", Command: testkit.Build(t, testkit.MCPFixture)}, Prefix: "fx",
			Tools: map[string]registry.Override{
				"echo": {Level: risk.Low}, "t_00": {Level: risk.Low}, "t_01": {Level: risk.High}, "t_02": {Level: risk.Critical},
			},
		}},
		BridgeKey: func(ns string) ([]byte, error) { return token.BridgeKey(e.secret, ns) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if e.st, err = store.Open(context.Background(), filepath.Join(dir, "data"), store.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.st.Close() })
	if e.log, err = audit.Open(e.auditPath, audit.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.log.Close() })
	v, err := token.NewVerifier(token.Options{Secret: e.secret, Audience: "capgate"})
	if err != nil {
		t.Fatal(err)
	}
	table, err := risk.ParseTable(capgate.DefaultRiskFileName, capgate.DefaultRiskFile)
	if err != nil {
		t.Fatal(err)
	}
	e.r, err = New(Options{Registry: reg, Verifier: v, Risk: table, Policy: policy, State: e.st, Audit: e.log, Secret: e.secret})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// caller mints a token for sub in chatType and authenticates it.
func (e *env) caller(t *testing.T, sub, chatType string, mod ...func(*token.Claims)) *Caller {
	t.Helper()
	cl := token.Claims{Sub: sub, ChatType: chatType, ChatID: "chat-" + sub}
	for _, m := range mod {
		m(&cl)
	}
	raw, err := token.Mint(e.secret, cl, token.MintOptions{Ash: true})
	if err != nil {
		t.Fatal(err)
	}
	e.tokens = append(e.tokens, raw)
	c, err := e.r.Authenticate(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) call(c *Caller, name, input string) (*tool.Result, error) {
	return e.r.Call(context.Background(), c, Request{Tool: name, Input: json.RawMessage(input), Protocol: "test"})
}

// denied checks that err is a *tool.Error with code (and gate, when set).
func denied(t *testing.T, err error, code tool.Code, gate string) *tool.Error {
	t.Helper()
	var te *tool.Error
	if !errors.As(err, &te) {
		t.Fatalf("want %s, got %v", code, err)
	}
	if te.Code != code || (gate != "" && te.Gate != gate) {
		t.Fatalf("want %s at gate %q, got %s at gate %q: %s", code, gate, te.Code, te.Gate, te.Message)
	}
	return te
}

func text(t *testing.T, res *tool.Result) string {
	t.Helper()
	if res == nil || len(res.Content) == 0 {
		t.Fatalf("empty result %+v", res)
	}
	var b struct{ Text string }
	json.Unmarshal(res.Content[0], &b)
	return b.Text
}

var everyone = Policy{Grants: []string{"rye.fetch.*", "rye.execute.tool.mcp.fx.*", "rye.execute.tool.ext.*", "rye.execute.tool.bridge.gog.*"}}

func TestCapabilityGate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Policy{
		Grants:   []string{"rye.fetch.tool.*", "rye.execute.tool.mcp.fx.echo"},
		Subjects: map[string]Subject{"alice": {Grants: []string{"rye.execute.tool.mcp.fx.t_*"}}},
	})
	bob := e.caller(t, "bob", "private")
	res, err := e.call(bob, "fx__echo", `{"message":"hi"}`)
	if err != nil || text(t, res) != "echo: hi" {
		t.Fatalf("echo: %v %+v", err, res)
	}
	_, err = e.call(bob, "mcp:fx:t_00", `{}`)
	te := denied(t, err, tool.CodePermissionDenied, GateCapability)
	if te.Required != "rye.execute.tool.mcp.fx.t_00" || !strings.Contains(te.Hint, "[policy.subjects.bob]") {
		t.Errorf("denial must name the capability and what allows it: %+v", te)
	}
	// alice's subject grants add t_*; a token's caps narrow them again.
	alice := e.caller(t, "alice", "private")
	if _, err := e.call(alice, "fx__t_00", `{}`); err != nil {
		t.Fatalf("alice t_00: %v", err)
	}
	narrowed := e.caller(t, "alice", "private", func(c *token.Claims) { c.Caps = []string{"rye.fetch.tool.*", "rye.execute.tool.mcp.fx.echo"} })
	_, err = e.call(narrowed, "fx__t_00", `{}`)
	te = denied(t, err, tool.CodePermissionDenied, GateCapability)
	if !strings.Contains(te.Message, "token caps") || !strings.Contains(te.Hint, "caps") {
		t.Errorf("a caps refusal says so: %+v", te)
	}
	// caps can never widen: a token claiming everything gets nothing, as
	// "*" is tier unrestricted and bob acknowledges no tier.
	wide := e.caller(t, "bob", "private", func(c *token.Claims) { c.Caps = []string{"*"} })
	_, err = e.call(wide, "fx__t_00", `{}`)
	denied(t, err, tool.CodeNotFound, GateResolve)
	if _, err := e.call(wide, "fx__echo", `{"message":"hi"}`); err == nil {
		t.Error("caps * without acknowledging unrestricted still granted echo")
	}
	// a skill scope attenuates: echo is allowed to alice, but not in a
	// skill that did not declare it.
	scope := &Scope{Name: "notes", Grants: permissions.MustSet("rye.execute.tool.mcp.fx.t_00")}
	_, err = e.r.Call(context.Background(), alice, Request{Tool: "fx__echo", Input: json.RawMessage(`{"message":"x"}`), Scope: scope})
	te = denied(t, err, tool.CodePermissionDenied, GateCapability)
	if !strings.Contains(te.Hint, "skill notes") {
		t.Errorf("skill refusal hint: %+v", te)
	}
	if _, err := e.r.Call(context.Background(), alice, Request{Tool: "fx__t_00", Scope: scope}); err != nil {
		t.Errorf("declared tool inside the skill: %v", err)
	}
}

// A tool the caller may not fetch is answered exactly like a tool that
// does not exist.
func TestInvisibleIsNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Policy{Grants: []string{"rye.execute.tool.mcp.fx.echo"}})
	c := e.caller(t, "bob", "private")
	_, errHidden := e.call(c, "fx__t_00", `{}`)
	_, errMissing := e.call(c, "fx__no_such", `{}`)
	h := denied(t, errHidden, tool.CodeNotFound, GateResolve)
	m := denied(t, errMissing, tool.CodeNotFound, GateResolve)
	if strings.Replace(h.Message, "fx__t_00", "X", 1) != strings.Replace(m.Message, "fx__no_such", "X", 1) ||
		h.Hint != m.Hint || h.Required != m.Required {
		t.Errorf("hidden %+v differs from missing %+v", h, m)
	}
	list := e.r.List(c, nil, registry.Filter{})
	if len(list) != 1 || list[0].ID != "mcp:fx:echo" {
		t.Errorf("list shows what may be fetched (execute implies fetch): %v", ids(list))
	}
	everyone := e.caller(t, "x", "private", func(c *token.Claims) { c.Caps = []string{} })
	if l := e.r.List(everyone, nil, registry.Filter{}); len(l) != 0 {
		t.Errorf("empty caps see nothing: %v", ids(l))
	}
}

func ids(ds []*tool.Descriptor) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.ID)
	}
	return out
}

func TestAcknowledge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Policy{Grants: everyone.Grants,
		Subjects: map[string]Subject{"alice": {Acknowledge: []string{"elevated"}}}})
	_, err := e.call(e.caller(t, "bob", "private"), "fx__t_01", `{}`)
	te := denied(t, err, tool.CodeAcknowledgeNeeded, GateAcknowledge)
	if te.Required != "elevated" || !strings.Contains(te.Hint, "elevated") {
		t.Errorf("%+v", te)
	}
	if _, err := e.call(e.caller(t, "alice", "private"), "fx__t_01", `{}`); err != nil {
		t.Errorf("alice acknowledged elevated: %v", err)
	}
	// The token's ack narrows the policy's.
	noAck := e.caller(t, "alice", "private", func(c *token.Claims) { c.Ack = []string{} })
	_, err = e.call(noAck, "fx__t_01", `{}`)
	denied(t, err, tool.CodeAcknowledgeNeeded, GateAcknowledge)
	// and cannot add to it.
	selfAck := e.caller(t, "bob", "private", func(c *token.Claims) { c.Ack = []string{"elevated"} })
	_, err = e.call(selfAck, "fx__t_01", `{}`)
	denied(t, err, tool.CodeAcknowledgeNeeded, GateAcknowledge)
}

func TestApproval(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	ctx := context.Background()
	alice := e.caller(t, "alice", "private")
	_, err := e.call(alice, "fx__t_02", `{"n":1}`)
	te := denied(t, err, tool.CodeApprovalRequired, GateApproval)
	id := regexp.MustCompile(`apr_[0-9a-f]{32}`).FindString(te.Hint)
	if !strings.HasPrefix(id, "apr_") || !strings.Contains(te.Message, id) {
		t.Fatalf("approval id in %+v", te)
	}
	// Asking again before approval gives the same id.
	_, err = e.call(alice, "fx__t_02", `{ "n" : 1 }`)
	if te2 := denied(t, err, tool.CodeApprovalRequired, GateApproval); !strings.Contains(te2.Message, id) {
		t.Errorf("same call, same approval: %s vs %s", te2.Message, id)
	}
	if _, err := e.st.Approve(ctx, id, "operator"); err != nil {
		t.Fatal(err)
	}
	// Bound to the caller and the input: bob and another input don't pass.
	_, err = e.call(e.caller(t, "bob", "private"), "fx__t_02", `{"n":1}`)
	denied(t, err, tool.CodeApprovalRequired, GateApproval)
	_, err = e.call(alice, "fx__t_02", `{"n":2}`)
	denied(t, err, tool.CodeApprovalRequired, GateApproval)
	// The same input, spaced otherwise, passes once.
	if _, err := e.call(alice, "fx__t_02", `{"n": 1}`); err != nil {
		t.Fatalf("approved call: %v", err)
	}
	_, err = e.call(alice, "fx__t_02", `{"n":1}`)
	denied(t, err, tool.CodeApprovalRequired, GateApproval)
	e.log.Close()
	b, _ := os.ReadFile(e.auditPath)
	if !strings.Contains(string(b), `"type":"approval"`) || !strings.Contains(string(b), id) {
		t.Errorf("the use of an approval is audited")
	}
}

// TestApprovalSurvivesChatPolicy: an approved call refused by the chat
// policy (the same caller, from a channel) keeps its approval, which the
// call from an allowed chat then uses. Every tool level is unrestricted
// here, so the bridge fixture's calendar needs an operator's approval.
func TestApprovalSurvivesChatPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	src := strings.Replace(string(capgate.DefaultRiskFile), "  LOW: safe\n  MED: write\n  HIGH: elevated\n",
		"  LOW: unrestricted\n  MED: unrestricted\n  HIGH: unrestricted\n", 1)
	table, err := risk.ParseTable("all-unrestricted.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	opts := e.r.opts
	opts.Risk = table
	if e.r, err = New(opts); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	private, channel := e.caller(t, "alice", "private"), e.caller(t, "alice", "channel")
	_, err = e.call(private, "gog__calendar_list_events", `{"day":"mon"}`)
	te := denied(t, err, tool.CodeApprovalRequired, GateApproval)
	id := regexp.MustCompile(`apr_[0-9a-f]{32}`).FindString(te.Message)
	if _, err := e.st.Approve(ctx, id, "operator"); err != nil {
		t.Fatal(err)
	}
	_, err = e.call(channel, "gog__calendar_list_events", `{"day":"mon"}`)
	denied(t, err, tool.CodeAccessDenied, GateChat)
	list, err := e.st.Approvals(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id || !list[0].Approved() {
		t.Fatalf("after the chat policy refused the call: %+v %v, want %s approved and unused", list, err, id)
	}
	if _, err := e.call(private, "gog__calendar_list_events", `{"day":"mon"}`); err != nil {
		t.Fatalf("the approved call from the private chat: %v", err)
	}
	if list, _ := e.st.Approvals(ctx); len(list) != 0 {
		t.Errorf("the approval is live after its call: %+v", list)
	}
}

func TestChatPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	// gog.email is sensitive: private only. The gate runs before auth.
	_, err := e.call(e.caller(t, "alice", "group"), "gog__email_list_messages", `{}`)
	te := denied(t, err, tool.CodeAccessDenied, GateChat)
	if !strings.Contains(te.Message, "private") || !strings.Contains(te.Message, "group") {
		t.Errorf("%+v", te)
	}
	_, err = e.call(e.caller(t, "alice", ""), "gog__email_list_messages", `{}`)
	denied(t, err, tool.CodeAccessDenied, GateChat)
	for _, chat := range []string{"private", "Private", " PRIVATE "} {
		_, err = e.call(e.caller(t, "alice", chat), "gog__email_list_messages", `{}`)
		denied(t, err, tool.CodeAuthRequired, GateAuth) // past the chat gate
	}
	// gog.calendar allows private and group, and needs no auth.
	if _, err := e.call(e.caller(t, "alice", "group"), "gog__calendar_list_events", `{}`); err != nil {
		t.Errorf("calendar in a group: %v", err)
	}
	_, err = e.call(e.caller(t, "alice", "channel"), "gog__calendar_list_events", `{}`)
	denied(t, err, tool.CodeAccessDenied, GateChat)
}

// Two users of the same bridge capability never see each other's
// credentials or flows.
func TestMultiUserIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	ctx := context.Background()
	alice, bob := e.caller(t, "alice", "private"), e.caller(t, "bob", "private")

	fa, err := e.r.AuthBegin(ctx, alice, "gog.email", "work")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(fa.FlowID, "caf_") || fa.AuthURL == "" || time.Until(fa.ExpiresAt) > 10*time.Minute {
		t.Errorf("flow %+v", fa)
	}
	// bob cannot complete alice's flow, and trying does not spend it.
	_, err = e.r.AuthComplete(ctx, bob, fa.FlowID, "", "code-1")
	denied(t, err, tool.CodeAuthFlowInvalid, GateAuth)
	acct, err := e.r.AuthComplete(ctx, alice, fa.FlowID, "https://localhost/cb?code=c1&state=s1", "")
	if err != nil || acct != "work" {
		t.Fatalf("alice completes: %q %v", acct, err)
	}
	// once.
	_, err = e.r.AuthComplete(ctx, alice, fa.FlowID, "", "code-1")
	denied(t, err, tool.CodeAuthFlowInvalid, GateAuth)

	res, err := e.call(alice, "gog__email_list_messages", `{"folder":"inbox"}`)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		TokenSub string `json:"token_sub"`
		Params   struct {
			AccountRef string `json:"account_ref"`
		}
	}
	json.Unmarshal(res.Structured, &out)
	if out.TokenSub != "alice" || out.Params.AccountRef != "work" {
		t.Errorf("the provider saw %+v", out)
	}
	// bob has no credential of his own: alice's does not help him.
	_, err = e.call(bob, "gog__email_list_messages", `{}`)
	denied(t, err, tool.CodeAuthRequired, GateAuth)
	_, err = e.r.Call(ctx, bob, Request{Tool: "gog__email_list_messages", Account: "work"})
	denied(t, err, tool.CodeAuthRequired, GateAuth)
	if accts, _ := e.st.Accounts(ctx, "bob", "gog.email"); len(accts) != 0 {
		t.Errorf("bob's accounts %v", accts)
	}
	// A callback whose state is not the flow's is refused.
	fb, err := e.r.AuthBegin(ctx, bob, "gog.email", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.r.AuthComplete(ctx, bob, fb.FlowID, "https://localhost/cb?code=c&state=forged", "")
	denied(t, err, tool.CodeAuthFlowInvalid, GateAuth)
	// A sensitive capability's flow cannot begin in a group chat.
	_, err = e.r.AuthBegin(ctx, e.caller(t, "bob", "group"), "gog.email", "")
	denied(t, err, tool.CodeAccessDenied, GateChat)
	_, err = e.r.AuthBegin(ctx, bob, "email", "")
	denied(t, err, tool.CodeNotFound, "")
}

// Identity fields in the input change nothing: routing uses the token.
func TestSpoofedIdentity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	ctx := context.Background()
	alice := e.caller(t, "alice", "private")
	f, _ := e.r.AuthBegin(ctx, alice, "gog.email", "")
	if _, err := e.r.AuthComplete(ctx, alice, f.FlowID, "", "c"); err != nil {
		t.Fatal(err)
	}
	spoof := `{"folder":"inbox","user_id":"alice","sub":"alice","chat_id":"chat-alice","chat_type":"private","context":{"user_id":"alice"}}`
	// bob, in a group, claiming to be alice in private: the chat gate
	// still sees a group.
	_, err := e.call(e.caller(t, "bob", "group"), "gog__email_list_messages", spoof)
	denied(t, err, tool.CodeAccessDenied, GateChat)
	// bob in private claiming alice: alice's credential is not his.
	_, err = e.call(e.caller(t, "bob", "private"), "gog__email_list_messages", spoof)
	denied(t, err, tool.CodeAuthRequired, GateAuth)
	// alice's own call with the fields: the provider's token says alice.
	res, err := e.call(e.caller(t, "alice", "private"), "gog__email_list_messages", strings.ReplaceAll(spoof, `"alice"`, `"bob"`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Structured), `"token_sub":"alice"`) {
		t.Errorf("provider saw %s", res.Structured)
	}
}

func TestOutputHardening(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	c := e.caller(t, "alice", "group")
	res, err := e.call(c, "gog__calendar_list_events", `{"leak":true}`)
	te := denied(t, err, tool.CodeInvalidOutput, GateOutput)
	if res != nil || strings.Contains(te.Error(), "ya29") || strings.Contains(fmt.Sprint(te), "leaked") {
		t.Fatalf("the credential reached the caller: %v %+v", res, te)
	}
	for _, tc := range []struct {
		out  string
		leak bool
	}{
		{`{"data":{"Access-Token":"x"}}`, true},
		{`{"list":[{"a":{" REFRESH_token ":"x"}}]}`, true},
		{`{"set-cookie":"x"}`, true},
		{`{"headers":{"Authorization":"Bearer x"}}`, true},
		{`{"client\u005fsecret":"x"}`, true},
		{`{"id_token":null}`, true},
		{`{"cookies":[]}`, true},
		{`{"token":"x"}`, true}, // issue 24.9: a bare "token" key is a credential
		{`{"secret_word":"y","cookie_count":3,"access_token_expires":1,"tokens_used":5}`, false},
		{`{"note":"the access_token is elsewhere"}`, false},
	} {
		r := &tool.Result{Structured: json.RawMessage(tc.out)}
		if _, found := harden.Result(r); found != tc.leak {
			t.Errorf("%s: found %v", tc.out, found)
		}
		// The same document inside a text block.
		b, _ := json.Marshal(map[string]string{"type": "text", "text": tc.out})
		r = &tool.Result{Content: []json.RawMessage{b}}
		if _, found := harden.Result(r); found != tc.leak {
			t.Errorf("text %s: found %v", tc.out, found)
		}
	}
}

func TestInputValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	c := e.caller(t, "alice", "private")
	for input, want := range map[string]string{
		`{"message":5}`:             "input.message: got number, want string",
		`{}`:                        "missing property 'message'",
		`{"message":"x","extra":1}`: "additional properties 'extra' not allowed",
		`{"message":""}`:            "input.message: minLength",
		`[1]`:                       "input must be a JSON object",
		`{"message":"x"} {}`:        "data after",
		`{"message":`:               "not valid JSON",
	} {
		_, err := e.call(c, "fx__echo", input)
		te := denied(t, err, tool.CodeInvalidInput, GateInput)
		if !strings.Contains(te.Message, want) {
			t.Errorf("%s: message %q does not say %q", input, te.Message, want)
		}
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	p := everyone
	p.Acknowledge = []string{"elevated"} // delete_things is HIGH
	e := newEnv(t, p)
	c := e.caller(t, "alice", "private")
	req := func(key, input string) (*tool.Result, error) {
		return e.r.Call(context.Background(), c, Request{Tool: "ext:tools.echo:delete_things", Input: json.RawMessage(input), IdempotencyKey: key})
	}
	first, err := req("k1", `{"msg":"a"}`)
	if err != nil {
		t.Fatal(err)
	}
	again, err := req("k1", `{"msg": "a"}`)
	if err != nil || compact(again.Structured) != compact(first.Structured) || text(t, again) != text(t, first) {
		t.Fatalf("replay: %v %+v", err, again)
	}
	_, err = req("k1", `{"msg":"b"}`)
	te := denied(t, err, tool.CodeInvalidInput, GateIdempotency)
	if !strings.Contains(te.Message, "another input") {
		t.Errorf("%+v", te)
	}
	// Another caller's key space is its own.
	if _, err := e.r.Call(context.Background(), e.caller(t, "bob", "private"),
		Request{Tool: "ext:tools.echo:delete_things", Input: json.RawMessage(`{"msg":"b"}`), IdempotencyKey: "k1"}); err != nil {
		t.Errorf("bob's k1: %v", err)
	}
	e.log.Close()
	b, _ := os.ReadFile(e.auditPath)
	if strings.Count(string(b), "idempotent replay") != 1 {
		t.Errorf("the replay is audited as one")
	}
}

func compact(b []byte) string {
	var out bytes.Buffer
	json.Compact(&out, b)
	return out.String()
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	p := everyone
	p.RateLimit = RateLimit{PerMinute: 1, Burst: 2}
	e := newEnv(t, p)
	c := e.caller(t, "alice", "private")
	for i := range 2 {
		if _, err := e.call(c, "fx__t_00", `{}`); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err := e.call(c, "fx__t_00", `{}`)
	denied(t, err, tool.CodeRateLimited, GateRateLimit)
	// per tool and per caller.
	if _, err := e.call(c, "fx__echo", `{"message":"x"}`); err != nil {
		t.Errorf("another tool: %v", err)
	}
	if _, err := e.call(e.caller(t, "bob", "private"), "fx__t_00", `{}`); err != nil {
		t.Errorf("another caller: %v", err)
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	now := time.Now()
	mint := func(secret string, c token.Claims) string {
		s, err := token.Mint([]byte(secret), c, token.MintOptions{Ash: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := map[string]string{
		"":      "missing",
		"a.b.c": "format",
		mint("wrong-secret", token.Claims{Sub: "a"}):                                                              "signature",
		mint(secretText, token.Claims{Sub: "a", IssuedAt: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute)}): "expired",
	}
	for raw, reason := range cases {
		_, err := e.r.Authenticate(raw)
		te := denied(t, err, tool.CodeTokenInvalid, GateToken)
		if !strings.HasPrefix(te.Message, reason) {
			t.Errorf("reason %q: %s", reason, te.Message)
		}
		if raw != "" && strings.Contains(te.Error(), raw) {
			t.Errorf("the error holds the token")
		}
	}
	// No anonymous caller unless configured.
	if _, err := e.r.Call(context.Background(), nil, Request{Tool: "fx__echo"}); tool.ErrorCode(err) != tool.CodeTokenInvalid {
		t.Errorf("nil caller: %v", err)
	}
}

func TestAnonymous(t *testing.T) {
	t.Parallel()
	p := Policy{Anonymous: &Subject{Sub: "anon", Grants: []string{"rye.execute.tool.mcp.fx.echo"}}}
	e := newEnv(t, p)
	c, err := e.r.Authenticate("")
	if err != nil || !c.Anonymous || c.Sub != "anon" {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := e.call(c, "fx__echo", `{"message":"x"}`); err != nil {
		t.Error(err)
	}
	_, err = e.call(c, "fx__t_00", `{}`)
	denied(t, err, tool.CodeNotFound, GateResolve)
	// A bad token is not anonymous: it is refused.
	if _, err := e.r.Authenticate("a.b.c"); tool.ErrorCode(err) != tool.CodeTokenInvalid {
		t.Errorf("bad token: %v", err)
	}
}

// The audit file holds every call and no token, secret or credential.
func TestAuditHoldsNoSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, everyone)
	ctx := context.Background()
	alice := e.caller(t, "alice", "private")
	f, _ := e.r.AuthBegin(ctx, alice, "gog.email", "")
	e.r.AuthComplete(ctx, alice, f.FlowID, "", "the-auth-code")
	e.call(alice, "gog__email_list_messages", `{}`)
	e.call(e.caller(t, "alice", "group"), "gog__calendar_list_events", `{"leak":true}`)
	e.call(alice, "fx__t_00", `{}`)
	e.call(alice, "fx__no_such", `{}`)
	e.r.Authenticate(e.tokens[0] + "x")
	if err := e.log.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(e.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	for _, tok := range e.tokens {
		for _, part := range append(strings.Split(tok, "."), tok) {
			if strings.Contains(log, part) {
				t.Errorf("the audit log holds (part of) a token: %.20s…", part)
			}
		}
	}
	for _, s := range []string{secretText, token.EncodeSecret([]byte(secretText)), "ya29", "leaked-provider-credential", "cred_1"} {
		if strings.Contains(log, s) {
			t.Errorf("the audit log holds %q", s)
		}
	}
	for _, want := range []string{`"type":"auth_begin"`, `"type":"auth_complete"`, `"type":"tool_call"`,
		`{"type":"grant_check","tool_name":"fx__t_00","runner":"local","resolved_source":"binding",`, `"tool":"mcp:fx:t_00","kind":"mcp","protocol":`,
		`"required":"rye.execute.tool.mcp.fx.t_00","layer":"policy","explanation":"rye.execute.tool.mcp.fx.t_00 is allowed by grant`,
		`"code":"capability_invalid_output"`, `"code":"capability_not_found"`} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
	if _, err := audit.VerifyFile(e.auditPath); err != nil {
		t.Errorf("chain: %v", err)
	}
}

// Rye: without its acknowledgement an elevated grant is denied. The ack a
// token claims and the acknowledge a skill declares decide which grants
// stand, each time the same way (the narrowed sets are cached).
func TestUnacknowledgedGrantsFall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Policy{Grants: []string{"rye.fetch.*"},
		Subjects: map[string]Subject{"alice": {Grants: []string{"rye.execute.tool.mcp.*"}, Acknowledge: []string{"elevated", "write"}}}})
	for range 2 {
		full := e.caller(t, "alice", "private")
		if _, err := e.call(full, "fx__t_00", `{}`); err != nil {
			t.Fatalf("alice, elevated acknowledged: %v", err)
		}
		narrowed := e.caller(t, "alice", "private", func(c *token.Claims) { c.Ack = []string{"write"} })
		_, err := e.call(narrowed, "fx__t_00", `{}`)
		te := denied(t, err, tool.CodePermissionDenied, GateCapability)
		if !strings.Contains(te.Hint, `acknowledge "elevated"`) || !strings.Contains(te.Hint, "ack claim") {
			t.Errorf("hint %q: want the tier and the ack claim named", te.Hint)
		}
	}
	// A skill's declared grants stand only on its own acknowledge.
	wide, err := e.r.NewScope("wide", []string{"rye.execute.tool.mcp.*"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if wide.Grants.Allows("rye.execute.tool.mcp.fx.t_00") {
		t.Error("a skill's unacknowledged elevated grant stands")
	}
	acked, err := e.r.NewScope("acked", []string{"rye.execute.tool.mcp.*"}, []string{"elevated"})
	if err != nil {
		t.Fatal(err)
	}
	alice := e.caller(t, "alice", "private")
	if _, err := e.r.Call(context.Background(), alice, Request{Tool: "fx__t_00", Input: json.RawMessage(`{}`), Scope: acked}); err != nil {
		t.Errorf("skill acknowledging elevated: %v", err)
	}
	// A skill acknowledging nothing: neither its grant nor alice's (both
	// elevated) stands, and the hint names what the skill must acknowledge.
	_, err = e.r.Call(context.Background(), alice, Request{Tool: "fx__t_00", Input: json.RawMessage(`{}`), Scope: wide})
	te := denied(t, err, tool.CodePermissionDenied, GateCapability)
	if !strings.Contains(te.Hint, `acknowledge "elevated"`) || !strings.Contains(te.Hint, "skill wide") {
		t.Errorf("skill hint %q: want the tier and the skill named", te.Hint)
	}
}
