package upstreamauth

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/zitadel/oidc/v3/pkg/client/tokenexchange"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/capgate/capgate/tool"
)

// Token exchange (RFC 8693, auth = "token-exchange"): a caller who signed
// in to capgate through [auth.oidc] gets a token for the upstream's
// resource by exchanging their own token at the same issuer. Their own
// token is never sent to the upstream (the MCP specification forbids
// passing it through); the exchanged one is cached in memory per
// (subject, server) until shortly before it expires.

// Exchange configures token exchange.
type Exchange struct {
	Issuer   string
	TokenURL string // the issuer's token endpoint; "" to discover it
	// ClientID and ClientSecret are capgate's client at the issuer; a
	// server's own (Server.ClientID) wins.
	ClientID     string
	ClientSecret string
	// SubjectToken returns the verified token of ctx's caller when that
	// caller is sub: the one exchanged.
	SubjectToken func(ctx context.Context, sub string) string
}

type exchanged struct {
	header http.Header
	until  time.Time
}

func (b *Broker) exchangeHeader(ctx context.Context, sub string, srv *Server, stale string) (http.Header, error) {
	key := sub + "\x00" + srv.Name
	b.mu.Lock()
	if b.exchanged == nil {
		b.exchanged = map[string]exchanged{}
	}
	e, ok := b.exchanged[key]
	b.mu.Unlock()
	if ok && b.opts.Now().Before(e.until) && (stale == "" || stale != e.header.Get("Authorization")) {
		return e.header, nil
	}
	var subject string
	if b.opts.Exchange.SubjectToken != nil {
		subject = b.opts.Exchange.SubjectToken(ctx, sub)
	}
	if subject == "" {
		return nil, &tool.Error{Code: tool.CodeAuthRequired, Gate: "upstream_auth", Required: "mcp:" + srv.Name,
			Message: "mcp server " + srv.Name + " takes a token exchanged for your own: sign in to capgate through its OpenID provider",
			Hint:    "use a token from the [auth.oidc] issuer"}
	}
	up, err := b.upstreamOf(ctx, srv)
	if err != nil {
		return nil, err
	}
	x := b.opts.Exchange
	if srv.ClientID != "" {
		x.ClientID, x.ClientSecret = srv.ClientID, srv.ClientSecret
	}
	topts := []func(*tokenexchange.OAuthTokenExchange){tokenexchange.WithHTTPClient(b.http)}
	if x.TokenURL != "" {
		topts = append(topts, tokenexchange.WithStaticTokenEndpoint(x.Issuer, x.TokenURL))
	}
	te, err := tokenexchange.NewTokenExchangerClientCredentials(ctx, x.Issuer, x.ClientID, x.ClientSecret, topts...)
	if err != nil {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "mcp server %s: token exchange: the issuer's token endpoint", srv.Name)
	}
	resp, err := tokenexchange.ExchangeToken(ctx, te, subject, oidc.AccessTokenType, "", "",
		[]string{up.Resource}, nil, up.Scopes, oidc.AccessTokenType)
	if err != nil || resp.AccessToken == "" {
		// The error may quote the request; only its kind is kept.
		b.opts.Logger.Info("token exchange refused", "server", srv.Name, "sub", sub)
		return nil, &tool.Error{Code: tool.CodeAuthRequired, Gate: "upstream_auth", Required: "mcp:" + srv.Name,
			Message: "mcp server " + srv.Name + ": the issuer would not exchange your token for one for this server", Err: err}
	}
	life := time.Duration(resp.ExpiresIn) * time.Second
	if life <= 0 {
		life = 5 * time.Minute
	}
	e = exchanged{header: bearer(resp.AccessToken), until: b.opts.Now().Add(life - min(b.opts.RefreshBefore, life/2))}
	b.mu.Lock()
	b.exchanged[key] = e
	b.mu.Unlock()
	return e.header, nil
}

func (b *Broker) forgetExchanged(sub, server string) {
	b.mu.Lock()
	delete(b.exchanged, sub+"\x00"+server)
	b.mu.Unlock()
}

// exchangeListerHeader is capgate's own token for srv, from the client
// credentials grant at the issuer for srv's resource: what lists srv's
// tools, a request made for no caller, so no user's token is exchanged
// for it. Cached until shortly before it expires.
func (b *Broker) exchangeListerHeader(ctx context.Context, srv *Server) (http.Header, error) {
	key := "\x00lister\x00" + srv.Name
	b.mu.Lock()
	e, ok := b.exchanged[key]
	b.mu.Unlock()
	if ok && b.opts.Now().Before(e.until) {
		return e.header, nil
	}
	up, err := b.upstreamOf(ctx, srv)
	if err != nil {
		return nil, err
	}
	x := b.opts.Exchange
	if srv.ClientID != "" {
		x.ClientID, x.ClientSecret = srv.ClientID, srv.ClientSecret
	}
	cc := clientcredentials.Config{ClientID: x.ClientID, ClientSecret: x.ClientSecret, TokenURL: cmp.Or(x.TokenURL, up.TokenEndpoint),
		Scopes: up.Scopes, EndpointParams: url.Values{"resource": {up.Resource}}}
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, b.http))
	if err != nil {
		b.opts.Logger.Info("client credentials for listing refused", "server", srv.Name, "reason", oauthReason(err))
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "mcp server %s: the issuer gave capgate no token of its own to list the tools (%s)",
			srv.Name, oauthReason(err))
	}
	life := 5 * time.Minute
	if !tok.Expiry.IsZero() {
		life = tok.Expiry.Sub(b.opts.Now())
	}
	e = exchanged{header: bearer(tok.AccessToken), until: b.opts.Now().Add(life - min(b.opts.RefreshBefore, life/2))}
	b.mu.Lock()
	if b.exchanged == nil {
		b.exchanged = map[string]exchanged{}
	}
	b.exchanged[key] = e
	b.mu.Unlock()
	return e.header, nil
}
