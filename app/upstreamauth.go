package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"slices"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/server"
	"github.com/capgate/capgate/sources"
	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
	"github.com/capgate/capgate/upstreamauth"
)

// Broker builds the upstream credentials broker for cfg's [mcp.servers]
// with auth set, over st; nil when none has.
func Broker(cfg *config.Config, st *store.Store, logger *slog.Logger, lookupEnv func(string) (string, bool)) (*upstreamauth.Broker, error) {
	servers, err := authServers(cfg, lookupEnv)
	if err != nil || len(servers) == 0 {
		return nil, err
	}
	signIn, err := signInOf(cfg, lookupEnv)
	if err != nil {
		return nil, err
	}
	b, err := upstreamauth.New(upstreamauth.Options{PublicURL: cfg.Server.PublicURL, Servers: servers, Store: st, Logger: logger,
		Exchange: exchangeOf(cfg), SignIn: signIn})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	return b, nil
}

// signInOf is the browser sign-in of account links: capgate's client at
// its [auth.oidc] provider, when the config names one.
func signInOf(cfg *config.Config, lookupEnv func(string) (string, bool)) (*upstreamauth.SignIn, error) {
	o := cfg.Auth.OIDC
	if o == nil || o.ClientID == "" {
		return nil, nil
	}
	s := &upstreamauth.SignIn{Issuer: o.Issuer, ClientID: o.ClientID}
	if o.ClientSecretEnv != "" {
		v, ok := lookupEnv(o.ClientSecretEnv)
		if !ok || v == "" {
			return nil, fmt.Errorf("%s: auth.oidc.client_secret_env: %s is not set", cfg.Path, o.ClientSecretEnv)
		}
		s.ClientSecret = v
	}
	return s, nil
}

// exchangeOf is token exchange at cfg's [auth.oidc] issuer: what is
// exchanged is the token the caller of ctx was verified from, at /mcp or
// /rpc, when that issuer issued it to sub (never an Ash context token,
// a token of another issuer, or another subject's).
func exchangeOf(cfg *config.Config) upstreamauth.Exchange {
	if cfg.Auth.OIDC == nil {
		return upstreamauth.Exchange{}
	}
	issuer := cfg.Auth.OIDC.Issuer
	return upstreamauth.Exchange{Issuer: issuer, SubjectToken: func(ctx context.Context, sub string) string {
		raw, c := router.CallerToken(ctx)
		if c == nil || c.Claims == nil || c.Claims.Issuer != issuer || c.Sub != sub {
			return ""
		}
		return raw
	}}
}

// authServers are cfg's [mcp.servers] with auth set, as the broker takes
// them.
func authServers(cfg *config.Config, lookupEnv func(string) (string, bool)) ([]upstreamauth.Server, error) {
	var servers []upstreamauth.Server
	for _, name := range slices.Sorted(maps.Keys(cfg.MCP.Servers)) {
		sc := cfg.MCP.Servers[name]
		if sc.Auth == "" || sc.Auth == "none" {
			continue
		}
		srv := upstreamauth.Server{Name: name, URL: sc.URL, Mode: upstreamauth.Mode(sc.Auth), ClientID: sc.ClientID,
			Scopes: sc.Scopes, Header: sc.TokenHeader}
		if sc.ClientSecretEnv != "" {
			v, ok := lookupEnv(sc.ClientSecretEnv)
			if !ok || v == "" {
				return nil, fmt.Errorf("%s: mcp.servers.%s.client_secret_env: %s is not set", cfg.Path, name, sc.ClientSecretEnv)
			}
			srv.ClientSecret = v
		}
		servers = append(servers, srv)
	}
	return servers, nil
}

// reloadBroker gives the running broker cfg's servers with auth. With no
// broker running (no server had auth at start, so /oauth/ is not served)
// a server with auth needs a restart.
func (a *App) reloadBroker(cfg *config.Config) error {
	servers, err := authServers(cfg, a.lookupEnv)
	if err != nil {
		return err
	}
	if a.Broker == nil {
		if len(servers) > 0 {
			return fmt.Errorf("%s: mcp.servers.%s.auth: the first server with auth needs a restart (capgate serves /oauth/ from its start)",
				cfg.Path, servers[0].Name)
		}
		return nil
	}
	if err := a.Broker.Reconfigure(servers); err != nil {
		return fmt.Errorf("%s: %w", cfg.Path, err)
	}
	return nil
}

// subjectOf is the caller a request to an upstream is for: the router's
// call carries it (tool.WithSubject), a relayed list or read the front
// door's caller.
func subjectOf(ctx context.Context) string {
	if sub := tool.SubjectFrom(ctx); sub != "" {
		return sub
	}
	if c := server.CallerFrom(ctx); c != nil && !c.Anonymous {
		return c.Sub
	}
	return ""
}

// authHooks make server name's requests carry each caller's own
// credential, on an upstream session of each caller's own. What is sent
// for no caller (listing the tools) carries the credential of the user
// who linked most recently.
func authHooks(b *upstreamauth.Broker, name string) mcp.Hooks {
	return mcp.Hooks{
		Headers: func(ctx context.Context, ask mcp.AskFunc) (http.Header, error) {
			sub := subjectOf(ctx)
			if sub == "" {
				return b.ListerHeader(ctx, name)
			}
			h, err := b.Header(ctx, sub, name, "")
			var te *tool.Error
			if err == nil || ask == nil || !errors.As(err, &te) || te.AuthURL == "" || !elicitsURL(ctx) {
				return h, err
			}
			if err := linkByElicitation(ctx, b, ask, sub, name, te); err != nil {
				return nil, err
			}
			return b.Header(ctx, sub, name, "")
		},
		SessionKey: subjectOf,
		Protocol:   upstreamHooks.Protocol,
		Unauthorized: func(ctx context.Context, refused http.Header, again bool) (http.Header, error) {
			sub := subjectOf(ctx)
			if sub == "" {
				return nil, tool.Errorf(tool.CodeBackendUnavailable, "mcp server %s refused the listing's credential", name)
			}
			if again {
				return nil, b.Refused(ctx, sub, name)
			}
			return b.Header(ctx, sub, name, refused.Get("Authorization"))
		},
	}
}

// elicitsURL reports whether the client of the call in ctx declared
// URL-mode elicitation: per request on 2026-07-28, at initialize before.
func elicitsURL(ctx context.Context) bool {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		c := info.ClientCapabilities
		return c != nil && c.Elicitation != nil && c.Elicitation.URL != nil
	}
	if cs, ok := mcpserver.ClientSessionFromContext(ctx).(mcpserver.SessionWithClientInfo); ok {
		c := cs.GetClientCapabilities()
		return c.Elicitation != nil && c.Elicitation.URL != nil
	}
	return false
}

// linkByElicitation asks the calling client to open the sign-in link
// need carries (URL-mode elicitation: an input request of the call on
// 2026-07-28, elicitation/create on 2025-11-25) and, once the user
// accepted, waits until the account is linked, here or on another
// replica. Declined, cancelled or not finished in time: need, whose text
// carries the link.
func linkByElicitation(ctx context.Context, b *upstreamauth.Broker, ask mcp.AskFunc, sub, name string, need *tool.Error) error {
	params, _ := json.Marshal(mcpgo.ElicitationParams{Mode: mcpgo.ElicitationModeURL, URL: need.AuthURL,
		ElicitationID: path.Base(need.AuthURL),
		Message:       fmt.Sprintf("mcp server %s acts as your own account: open the link to sign in there, then this call goes on.", name)})
	raw, err := ask(ctx, string(mcpgo.MethodElicitationCreate), params)
	if err != nil {
		return need
	}
	var res struct {
		Action string `json:"action"`
	}
	if json.Unmarshal(raw, &res) != nil || res.Action != string(mcpgo.ElicitationResponseActionAccept) {
		e := *need
		e.Message = fmt.Sprintf("mcp server %s needs you to sign in with your own account, and the sign-in was %s: open %s",
			name, cmp.Or(res.Action, "not answered"), need.AuthURL)
		return &e
	}
	if err := b.WaitLinked(ctx, sub, name); err != nil {
		e := *need
		e.Message = fmt.Sprintf("mcp server %s: the sign-in was not finished (%s): open %s", name, tool.ErrorMessage(err), need.AuthURL)
		return &e
	}
	return nil
}

// WithAuth sets the hooks of bo's servers that have auth, and has a
// link retry a server whose listing waited for one (in reg's registry,
// when reg gives one).
func WithAuth(bo *sources.BuildOptions, b *upstreamauth.Broker, reg func() *registry.Registry) {
	if b == nil {
		return
	}
	for i := range bo.MCP {
		name := bo.MCP[i].Options.Name
		if _, ok := b.Server(name); ok {
			bo.MCP[i].Options.Hooks = authHooks(b, name)
		}
	}
	b.SetOnLinked(func(name string) {
		var r *registry.Registry
		if reg != nil {
			r = reg()
		}
		if r == nil {
			return
		}
		for _, s := range r.Sources() {
			if ms, ok := s.(*mcp.Source); ok && s.ID() == name {
				ms.Retry()
			}
		}
	})
}
