package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/internal/testkit/oauthas"
)

// linkingUser is an MCP client's user: asked to open a URL, the client
// accepts, and the user opens it in their browser (signed in upstream as
// account) and presses capgate's button, a moment later, as a person
// would.
type linkingUser struct {
	t       *testing.T
	as      *oauthas.AS
	account string
	decline bool

	mu     sync.Mutex
	asked  []mcp.ElicitationParams
	visits chan string // the callback page of each visit
}

func (u *linkingUser) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	u.mu.Lock()
	u.asked = append(u.asked, req.Params)
	u.mu.Unlock()
	if u.decline || req.Params.Mode != mcp.ElicitationModeURL {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionDecline}}, nil
	}
	go func() {
		status, page := oauthas.Click(u.t, u.as.Browser(u.t, u.account), req.Params.URL)
		if status != 200 {
			page = "HTTP error: " + page
		}
		u.visits <- page
	}()
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept}}, nil
}

// elicitClient is an mcp-go client of protocol (the latest when "") with
// caps, for sub, whose elicitations u answers.
func (o *oauthServe) elicitClient(t *testing.T, sub, protocol string, caps mcp.ClientCapabilities, u *linkingUser) *client.Client {
	t.Helper()
	opts := []transport.StreamableHTTPCOption{transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + o.tok(t, sub)})}
	if protocol != "" {
		opts = append(opts, transport.WithContinuousListening())
	}
	tr, err := transport.NewStreamableHTTP(o.URL+"/mcp", opts...)
	if err != nil {
		t.Fatal(err)
	}
	copts := []client.ClientOption{client.WithElicitationHandler(u), client.WithClientCapabilities(caps)}
	if protocol != "" {
		copts = append(copts, client.WithProtocolVersion(protocol))
	}
	c := newMCPClient(tr, copts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = protocol
	if protocol == "" {
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	}
	init.Params.Capabilities = caps
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitListed waits until c sees tracker's whoami: capgate lists it once
// someone linked an account.
func (o *oauthServe) waitListed(t *testing.T, c *client.Client) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, "tracker__whoami listed", func() bool {
		res, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
		if err != nil {
			return false
		}
		for _, tl := range res.Tools {
			if tl.Name == "tracker__whoami" {
				return true
			}
		}
		return false
	})
}

// whoamiVia calls tracker's whoami on c; it returns whose account
// answered, or the refusal's code, link and text.
func (o *oauthServe) whoamiVia(t *testing.T, c *client.Client, note string) (who, code, authURL, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "tracker__whoami", Arguments: map[string]any{"note": note}}})
	if err != nil {
		t.Fatalf("tools/call: %v", err)
	}
	raw, _ := json.Marshal(res)
	o.keep(raw)
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if res.IsError {
		if res.Meta != nil {
			if e, ok := res.Meta.AdditionalFields["capgate/error"].(map[string]any); ok {
				code, _ = e["code"].(string)
				authURL, _ = e["auth_url"].(string)
			}
		}
		return "", code, authURL, text
	}
	var out struct{ Sub, Note string }
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	if out.Note != note {
		t.Errorf("the note %q came back as %q", note, out.Note)
	}
	return out.Sub, "", "", text
}

// TestUpstreamOAuthURLElicitation: a caller who has not linked an
// account calls a tool of the auth upstream through a real capgate serve
// with a real mcp-go client. A 2026-07-28 client that declared URL-mode
// elicitation gets the sign-in link as an input request of its call, and
// a 2025-11-25 one as elicitation/create with mode "url"; the user opens
// it and signs in (real oidc-provider), and the same call then completes
// with the caller's own account. A user who declines, and a client that
// declared only form elicitation, get the tool error carrying the link.
// No token is in any answer or in serve's log.
func TestUpstreamOAuthURLElicitation(t *testing.T) {
	t.Parallel()
	o := startOAuthServe(t)
	// The upstream lists its tools once someone has linked (README).
	if status, _ := o.as.Visit(t, "bob-upstream", linkRe.FindString(o.cli(t, "accounts", "link", "tracker", "--sub", "bob"))); status != 200 {
		t.Fatalf("bob's link: %d", status)
	}
	urlCaps := mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{URL: &struct{}{}}}
	for _, tc := range []struct{ sub, protocol string }{{"alice", ""}, {"carol", "2025-11-25"}} {
		t.Run("protocol="+tc.protocol, func(t *testing.T) {
			u := &linkingUser{t: t, as: o.as, account: tc.sub + "-upstream", visits: make(chan string, 1)}
			c := o.elicitClient(t, tc.sub, tc.protocol, urlCaps, u)
			o.waitListed(t, c)
			who, code, _, text := o.whoamiVia(t, c, "first")
			if who != tc.sub+"-upstream" {
				t.Fatalf("%s's first call: who %q code %q: %s\n%s", tc.sub, who, code, text, o.Logs())
			}
			u.mu.Lock()
			asked := u.asked
			u.mu.Unlock()
			if len(asked) != 1 || asked[0].Mode != mcp.ElicitationModeURL || !linkRe.MatchString(asked[0].URL) || asked[0].ElicitationID == "" ||
				!strings.Contains(asked[0].Message, "tracker") {
				t.Errorf("what the client was asked: %+v", asked)
			}
			if page := <-u.visits; !strings.Contains(page, "<b>"+tc.sub+"</b> is now linked to account <b>"+tc.sub+"-upstream</b>") {
				t.Errorf("the user's browser ended on: %s", page)
			}
			// Linked now: the next call asks nothing.
			if who, code, _, _ := o.whoamiVia(t, c, "second"); who != tc.sub+"-upstream" {
				t.Errorf("%s's second call: %q %q", tc.sub, who, code)
			}
			if u.mu.Lock(); len(u.asked) != 1 {
				t.Errorf("asked again though linked: %d", len(u.asked))
			}
			u.mu.Unlock()
		})
	}

	// dave declines: the call ends with the link in a tool error.
	t.Run("declined", func(t *testing.T) {
		u := &linkingUser{t: t, as: o.as, account: "dave-upstream", decline: true}
		c := o.elicitClient(t, "dave", "", urlCaps, u)
		o.waitListed(t, c)
		_, code, authURL, text := o.whoamiVia(t, c, "d1")
		if code != "capability_auth_required" || !linkRe.MatchString(authURL) || !strings.Contains(text, authURL) || !strings.Contains(text, "decline") {
			t.Errorf("declined: code %q auth_url %q text %q", code, authURL, text)
		}
	})
	// erin's client declared form elicitation only: not asked, the link
	// is in the tool error.
	t.Run("form-only", func(t *testing.T) {
		u := &linkingUser{t: t, as: o.as, account: "erin-upstream"}
		c := o.elicitClient(t, "erin", "2025-11-25", mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{Form: &struct{}{}}}, u)
		o.waitListed(t, c)
		_, code, authURL, text := o.whoamiVia(t, c, "e1")
		if code != "capability_auth_required" || !linkRe.MatchString(authURL) || !strings.Contains(text, authURL) {
			t.Errorf("form-only client: code %q auth_url %q text %q", code, authURL, text)
		}
		if len(u.asked) != 0 {
			t.Errorf("a form-only client was asked: %+v", u.asked)
		}
	})

	secrets := o.storedSecrets(t, "alice", "bob", "carol")

	// A relayed resources/read carries the caller's token too, and the
	// upstream's 401 gets the same one refresh as a tools/call; when the
	// refreshed token is refused too, the caller is sent to sign in again.
	t.Run("resources/read 401", func(t *testing.T) {
		u := &linkingUser{t: t, as: o.as, account: "alice-upstream"}
		c := o.elicitClient(t, "alice", "", urlCaps, u)
		testkit.WaitFor(t, 30*time.Second, "whoami://me listed", func() bool {
			res, err := c.ListResources(context.Background(), mcp.ListResourcesRequest{})
			return err == nil && len(res.Resources) > 0 && res.Resources[0].URI == "whoami://me"
		})
		read := func() (string, error) {
			res, err := c.ReadResource(context.Background(), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "whoami://me"}})
			if err != nil {
				o.keep([]byte(err.Error()))
				return "", err
			}
			raw, _ := json.Marshal(res)
			o.keep(raw)
			if len(res.Contents) != 1 {
				return "", fmt.Errorf("%d contents", len(res.Contents))
			}
			tc, _ := res.Contents[0].(mcp.TextResourceContents)
			return tc.Text, nil
		}
		if got, err := read(); got != "you are alice-upstream" {
			t.Fatalf("alice's read: %q %v", got, err)
		}
		o.up.Invalidate(o.heldToken(t, "alice"))
		if got, err := read(); got != "you are alice-upstream" {
			t.Errorf("alice's read after the upstream's 401: %q %v", got, err)
		}
		secrets = append(secrets, o.storedSecrets(t, "alice")...)
		o.up.Refuse("alice-upstream", true)
		if got, err := read(); err == nil || !linkRe.MatchString(err.Error()) {
			t.Errorf("alice's read refused after the refresh: %q %v, want an error with a link", got, err)
		}
	})

	secrets = append(secrets, o.up.Tokens()...)
	o.mu.Lock()
	seen := map[string]string{"serve's log": o.Logs(), "the responses": strings.Join(o.out, "\n")}
	o.mu.Unlock()
	if len(secrets) < 3 {
		t.Fatalf("only %d secrets to look for", len(secrets))
	}
	for where, text := range seen {
		for _, s := range secrets {
			if len(s) >= 16 && strings.Contains(text, s) {
				t.Errorf("%s carries a secret (%.12s...)", where, s)
			}
		}
	}
}
