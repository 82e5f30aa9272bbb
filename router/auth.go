package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/router/state"
	"github.com/capgate/capgate/tool"
)

// AuthFlow is what beginning an auth flow returns to the caller: a handle
// and where to send the user. The provider's flow state stays in the store.
type AuthFlow struct {
	FlowID    string    `json:"flow_id"`
	AuthURL   string    `json:"auth_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// AuthBegin starts linking an account for a capability (gog.email). The
// caller must be allowed to execute one of its operations, in a chat the
// capability allows.
func (r *Router) AuthBegin(ctx context.Context, c *Caller, capabilityID, accountHint string) (flow *AuthFlow, err error) {
	ev := audit.Event{Type: audit.TypeAuthBegin, CapabilityID: capabilityID}
	// The flow runs only if its records can be made.
	tk, err := r.admit()
	if err != nil {
		return nil, err
	}
	defer tk.Done()
	defer func() { err = r.auditAuth(c, &ev, &tk, err) }()
	if c == nil {
		return nil, &tool.Error{Code: tool.CodeTokenInvalid, Message: "token invalid: missing", Gate: GateToken}
	}
	d, auth, err := r.authCapability(c, capabilityID)
	if err != nil {
		return nil, err
	}
	resolved(&ev, d)
	tok, err := r.bridgeToken(c, d.Source)
	if err != nil {
		return nil, err
	}
	begun, err := auth.AuthBegin(ctx, capabilityID, accountHint, tok)
	if err != nil {
		return nil, err
	}
	f, err := r.opts.State.BeginFlow(ctx, c.Sub, capabilityID, accountHint, begun.Raw)
	if err != nil {
		return nil, err
	}
	ev.FlowID = f.ID
	return &AuthFlow{FlowID: f.ID, AuthURL: begun.AuthURL, ExpiresAt: f.ExpiresAt.UTC()}, nil
}

// AuthComplete finishes a flow the caller began, with the callback URL the
// provider redirected to or the code the user copied. The flow is used up
// whatever happens next; another caller's flow id is refused like an
// unknown one and stays usable by its owner.
func (r *Router) AuthComplete(ctx context.Context, c *Caller, flowID, callbackURL, code string) (account string, err error) {
	ev := audit.Event{Type: audit.TypeAuthComplete, FlowID: flowID}
	// The flow runs only if its records can be made.
	tk, err := r.admit()
	if err != nil {
		return "", err
	}
	defer tk.Done()
	defer func() { err = r.auditAuth(c, &ev, &tk, err) }()
	if c == nil {
		return "", &tool.Error{Code: tool.CodeTokenInvalid, Message: "token invalid: missing", Gate: GateToken}
	}
	callbackURL, code = strings.TrimSpace(callbackURL), strings.TrimSpace(code)
	if (callbackURL == "") == (code == "") {
		return "", &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "give exactly one of callback_url and code"}
	}
	var cb url.Values
	if callbackURL != "" {
		u, perr := url.Parse(callbackURL)
		if perr != nil || u.Scheme == "" {
			return "", &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "callback_url is not an absolute URL"}
		}
		cb = u.Query()
		code = cb.Get("code")
	}
	f, err := r.opts.State.TakeFlow(ctx, flowID, c.Sub)
	if errors.Is(err, state.ErrFlowInvalid) {
		return "", &tool.Error{Code: tool.CodeAuthFlowInvalid, Gate: GateAuth,
			Message: "auth flow is unknown, expired, already completed, or was begun by someone else",
			Hint:    "begin a new flow with capability.auth.begin"}
	}
	if err != nil {
		return "", err
	}
	ev.CapabilityID = f.CapabilityID
	d, auth, err := r.authCapability(c, f.CapabilityID)
	if err != nil {
		return "", err
	}
	resolved(&ev, d)
	var begun struct {
		FlowState     json.RawMessage `json:"flow_state"`
		ExpectedState string          `json:"expected_callback_state"`
	}
	_ = json.Unmarshal(f.State, &begun)
	state := cb.Get("state")
	if begun.ExpectedState != "" && callbackURL != "" && state != begun.ExpectedState {
		return "", &tool.Error{Code: tool.CodeAuthFlowInvalid, Gate: GateAuth,
			Message: "the callback's state does not match the flow's: refused", Hint: "begin a new flow"}
	}
	params := map[string]any{"flow_state": begun.FlowState, "authorization_code": nullable(code),
		"raw_callback_url": nullable(callbackURL), "state": nullable(state)}
	if len(begun.FlowState) == 0 {
		params["flow_state"] = map[string]any{}
	}
	p, _ := json.Marshal(params)
	tok, err := r.bridgeToken(c, d.Source)
	if err != nil {
		return "", err
	}
	res, err := auth.AuthComplete(ctx, f.CapabilityID, p, tok)
	if err != nil {
		return "", err
	}
	var done struct {
		AccountRef string          `json:"account_ref"`
		Material   json.RawMessage `json:"credential_material"`
	}
	if err := json.Unmarshal(res, &done); err != nil || strings.TrimSpace(done.AccountRef) == "" {
		return "", tool.Errorf(tool.CodeInvalidOutput, "the provider's auth_complete answer has no account_ref")
	}
	if len(done.Material) == 0 {
		done.Material = json.RawMessage("{}")
	}
	if err := r.opts.State.PutCredential(ctx, c.Sub, f.CapabilityID, done.AccountRef, done.Material); err != nil {
		return "", err
	}
	ev.AccountRef = done.AccountRef
	return done.AccountRef, nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// authCapability finds a capability's operations the caller may see and
// checks that it may execute one of them, in this chat; it returns one
// operation and the source that runs the flow.
func (r *Router) authCapability(c *Caller, capabilityID string) (*tool.Descriptor, tool.Authenticator, error) {
	notFound := &tool.Error{Code: tool.CodeNotFound, Gate: GateResolve, Message: fmt.Sprintf("no capability named %q", capabilityID)}
	ns, capName, ok := strings.Cut(capabilityID, ".")
	if !ok || ns == "" || capName == "" {
		notFound.Message += ": capability ids are namespaced, such as gog.email"
		return nil, nil, notFound
	}
	var first, allowed *tool.Descriptor
	for _, d := range r.opts.Registry.Snapshot().Tools {
		if d.Kind != tool.KindBridge || d.Source != ns || !strings.HasPrefix(d.Name, capName+".") || !r.visible(c, d) {
			continue
		}
		if first == nil {
			first = d
		}
		if c.grants.Allows(r.toolCaps.get(d.ID).execute) {
			allowed = d
			break
		}
	}
	if first == nil {
		return nil, nil, notFound
	}
	if allowed == nil {
		required := r.toolCaps.get(first.ID).execute
		return nil, nil, &tool.Error{Code: tool.CodePermissionDenied, Gate: GateCapability, Required: required,
			Message: fmt.Sprintf("no operation of %s is granted (%s is not)", capabilityID, required),
			Hint:    r.grantHint(c, layerPolicy, required)}
	}
	if err := chatGate(c, allowed); err != nil {
		return nil, nil, err
	}
	src, ok := r.opts.Registry.Source(allowed)
	auth, isAuth := src.(tool.Authenticator)
	if !ok || !isAuth {
		return nil, nil, tool.Errorf(tool.CodeBackendUnavailable, "%s has no auth flow", capabilityID)
	}
	return allowed, auth, nil
}

// auditAuth logs an auth event and turns an unexpected error into an
// internal one, whose details stay in the log.
func (r *Router) auditAuth(c *Caller, ev *audit.Event, tk *audit.Ticket, err error) error {
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	ev.Decision = "allow"
	if err != nil {
		ev.Decision, ev.Code = "deny", string(tool.ErrorCode(err))
		var te *tool.Error
		if errors.As(err, &te) {
			ev.Gate = te.Gate
		} else {
			r.opts.Logger.Error("auth flow failed", "type", ev.Type, "capability", ev.CapabilityID, "err", err)
			err = tool.Wrap(err, tool.CodeInternal, "internal error")
		}
	}
	r.record(tk, *ev)
	return err
}
