package bridge

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/tool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var secret = []byte("0123456789abcdef0123456789abcdef")

// provider starts the fixture bridge in the given misbehaviour mode.
func provider(t *testing.T, mode string) *Provider {
	t.Helper()
	return providerWith(t, mode, 5*time.Second)
}

// providerWith is provider with timeout.
func providerWith(t *testing.T, mode string, timeout time.Duration) *Provider {
	t.Helper()
	bin := testkit.Build(t, testkit.BridgeFixture)
	t.Setenv("BRIDGE_FIXTURE_MODE", mode)
	p, err := New(Options{
		Namespace: "gog", Command: []string{bin}, Timeout: timeout, Secret: secret,
		Env: []string{"BRIDGE_FIXTURE_MODE"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// token signs an Ash context token the way Ash does.
func token(sub string) string {
	enc := base64.RawURLEncoding
	h := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"ASH_CONTEXT","ver":1}`))
	b, _ := json.Marshal(map[string]any{"sub": sub, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Minute).Unix(), "jti": "j1", "ver": 1})
	p := enc.EncodeToString(b)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(h + "." + p))
	return h + "." + p + "." + enc.EncodeToString(mac.Sum(nil))
}

func TestDefinitions(t *testing.T) {
	p := provider(t, "")
	tools, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*tool.Descriptor{}
	for _, d := range tools {
		byName[d.Name] = d
	}
	if len(tools) != 3 {
		t.Fatalf("%d tools, want 3", len(tools))
	}
	list := byName["email.list_messages"]
	if list == nil || list.ID != "bridge:gog:email.list_messages" || list.Title != "Gmail" || !list.RequiresAuth {
		t.Fatalf("list_messages: %+v", list)
	}
	if !list.Sensitive || strings.Join(list.AllowedChatTypes, ",") != "private" {
		t.Errorf("sensitive with no chat types must be private only: %v %v", list.Sensitive, list.AllowedChatTypes)
	}
	if string(list.InputSchema) != `{"properties":{"folder":{"type":"string"}},"type":"object"}` {
		t.Errorf("input schema %s", list.InputSchema)
	}
	if send := byName["email.send"]; !send.Mutating || string(send.InputSchema) != `{"type":"object"}` {
		t.Errorf("send: %+v", send)
	}
	ev := byName["calendar.list_events"]
	if ev == nil || ev.Sensitive || ev.RequiresAuth || strings.Join(ev.AllowedChatTypes, ",") != "group,private" {
		t.Errorf("list_events (operations as a map, chat types normalised): %+v", ev)
	}
}

func TestInvoke(t *testing.T) {
	t.Setenv("CAPGATE_TEST_HOST_SECRET", "must-not-leak")
	p := provider(t, "")
	tools, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var list *tool.Descriptor
	for _, d := range tools {
		if d.Name == "email.list_messages" {
			list = d
		}
	}
	r, err := p.Call(context.Background(), tool.Call{
		Tool: list, Input: json.RawMessage(`{"folder":"inbox"}`), Account: "work",
		IdempotencyKey: "k1", ContextToken: token("alice"),
		// Identity in the input is just data to the bridge.
	})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Params     map[string]any `json:"params"`
		Namespace  string         `json:"namespace"`
		TokenSub   string         `json:"token_sub"`
		SecretLeak string         `json:"secret_leak"`
	}
	if err := json.Unmarshal(r.Structured, &out); err != nil {
		t.Fatalf("%v: %s", err, r.Structured)
	}
	want := map[string]any{"capability_id": "gog.email", "operation": "list_messages",
		"input_data": map[string]any{"folder": "inbox"}, "account_ref": "work", "idempotency_key": "k1"}
	for k, v := range want {
		if b1, _ := json.Marshal(out.Params[k]); string(b1) != mustJSON(v) {
			t.Errorf("param %s = %s, want %s", k, b1, mustJSON(v))
		}
	}
	if out.TokenSub != "alice" {
		t.Errorf("the bridge could not verify the context token with the secret it was given: %q", out.TokenSub)
	}
	if out.SecretLeak != "" || out.Namespace != "gog" {
		t.Errorf("secret leak %q, namespace %q", out.SecretLeak, out.Namespace)
	}
	// Without account or idempotency key they are null, as Ash sends them.
	r, err = p.Call(context.Background(), tool.Call{Tool: list, ContextToken: token("bob")})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(r.Structured), `"account_ref":null`) || !strings.Contains(string(r.Structured), `"input_data":{}`) {
		t.Errorf("nulls: %s", r.Structured)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestBareResultIsTheOutput(t *testing.T) {
	p := provider(t, "")
	tools, err := p.List(context.Background())
	if err != nil || len(tools) == 0 {
		t.Fatalf("list: %d tools, %v", len(tools), err) // was an index panic when the list failed under load
	}
	t.Setenv("BRIDGE_FIXTURE_MODE", "bareresult")
	r, err := p.Call(context.Background(), tool.Call{Tool: tools[0]})
	if err != nil || !strings.Contains(string(r.Structured), `"params"`) {
		t.Errorf("%v %s", err, r.Structured)
	}
}

// TestEnvelopeViolations runs each misbehaviour against invoke.
func TestEnvelopeViolations(t *testing.T) {
	good := provider(t, "")
	tools, err := good.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mode string
		code tool.Code
		msg  string
	}{
		{"notjson", tool.CodeInvalidOutput, "bridge gog: command returned invalid JSON"},
		{"array", tool.CodeInvalidOutput, "returned non-object JSON"},
		{"badversion", tool.CodeInvalidOutput, "version mismatch"},
		{"floatversion", tool.CodeInvalidOutput, "version mismatch"},
		{"wrongid", tool.CodeInvalidOutput, "id mismatch"},
		{"both", tool.CodeInvalidOutput, "exactly one of result or error"},
		{"neither", tool.CodeInvalidOutput, "exactly one of result or error"},
		{"errornotobject", tool.CodeInvalidOutput, "error payload must be an object"},
		{"emptycode", tool.CodeInvalidOutput, "error.code is required"},
		{"resultnotobject", tool.CodeInvalidOutput, "result must be an object"},
		{"providererror", "gog_quota_exceeded", "daily quota exceeded"},
		{"exit3", tool.CodeBackendUnavailable, "command failed with exit 3 (its stderr is in capgate's log)"},
		// The fixture sleeps 30 s: a provider of its own times out sooner.
		{"sleep", tool.CodeBackendUnavailable, "invoke timed out after 1s"},
	}
	hasty := providerWith(t, "", time.Second)
	// Its definitions within that second: tried again, as a loaded
	// machine may start the fixture slower.
	testkit.WaitFor(t, time.Minute, "the definitions of a provider with a 1 s timeout", func() bool {
		_, err := hasty.List(context.Background())
		return err == nil
	})
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			t.Setenv("BRIDGE_FIXTURE_MODE", tt.mode)
			p := good
			if tt.mode == "sleep" {
				p = hasty
			}
			_, err := p.Call(context.Background(), tool.Call{Tool: tools[0], ContextToken: token("a")})
			// A provider's stderr goes to the log, never to the caller.
			if tool.ErrorCode(err) != tt.code || !strings.Contains(tool.ErrorMessage(err), tt.msg) || strings.Contains(tool.ErrorMessage(err), "provider crashed") {
				t.Errorf("got %s %q, want %s %q", tool.ErrorCode(err), tool.ErrorMessage(err), tt.code, tt.msg)
			}
		})
	}
	missing, _ := New(Options{Namespace: "gog", Command: []string{"/nonexistent/bridge"}})
	if _, err := missing.List(context.Background()); tool.ErrorCode(err) != tool.CodeBackendUnavailable || !strings.Contains(err.Error(), "command not found") {
		t.Errorf("missing command: %v", err)
	}
}

// TestRegistrationErrorsLeaveNoPartialState: a bad definitions answer
// fails whole, and the operations of the last good answer stay callable.
func TestRegistrationErrorsLeaveNoPartialState(t *testing.T) {
	p := provider(t, "")
	tools, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]string{
		"foreignns": `capability "other.calendar" is outside the provider's namespace "gog"`,
		"dupe":      `capability "gog.email" is defined twice`,
		"badid":     `capability id "gog.Calendar" must match`,
		"mapkey":    `operation key "x" does not match its name "y"`,
	}
	for mode, want := range tests {
		t.Setenv("BRIDGE_FIXTURE_MODE", mode)
		got, err := p.List(context.Background())
		if got != nil || tool.ErrorCode(err) != tool.CodeInvalidOutput || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %d tools, %v; want none and %q", mode, len(got), err, want)
		}
	}
	t.Setenv("BRIDGE_FIXTURE_MODE", "")
	if _, err := p.Call(context.Background(), tool.Call{Tool: tools[0], ContextToken: token("a")}); err != nil {
		t.Errorf("last good operations were lost: %v", err)
	}
}

func TestAuthFlow(t *testing.T) {
	p := provider(t, "")
	b, err := p.AuthBegin(context.Background(), "gog.email", "", token("alice"))
	if err != nil || b.AuthURL != "https://accounts.example/auth?state=s1" || !strings.Contains(string(b.Raw), `"flow_state"`) {
		t.Fatalf("auth_begin: %+v %v", b, err)
	}
	res, err := p.AuthComplete(context.Background(), "gog.email", json.RawMessage(`{"flow_state":{"nonce":"n1"},"authorization_code":"c"}`), token("alice"))
	if err != nil || !strings.Contains(string(res), `"account_ref":"work"`) {
		t.Fatalf("auth_complete: %s %v", res, err)
	}
	t.Setenv("BRIDGE_FIXTURE_MODE", "noauthurl")
	if _, err := p.AuthBegin(context.Background(), "gog.email", "", token("alice")); tool.ErrorCode(err) != tool.CodeInvalidOutput {
		t.Errorf("no auth_url: %v", err)
	}
}

func TestNewChecksOptions(t *testing.T) {
	if _, err := New(Options{Namespace: "Gog", Command: []string{"x"}}); err == nil {
		t.Error("accepted namespace Gog")
	}
	if _, err := New(Options{Namespace: "gog"}); err == nil {
		t.Error("accepted an empty command")
	}
}
