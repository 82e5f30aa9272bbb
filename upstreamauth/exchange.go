package upstreamauth

import (
	"context"
	"net/http"
	"time"

	"github.com/zitadel/oidc/v3/pkg/client/tokenexchange"
	"github.com/zitadel/oidc/v3/pkg/oidc"

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
	Issuer       string
	TokenURL     string // the issuer's token endpoint
	ClientID     string // capgate's client at the issuer
	ClientSecret string
	// SubjectToken returns the caller's own verified token for ctx: the
	// one exchanged.
	SubjectToken func(ctx context.Context) string
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
		subject = b.opts.Exchange.SubjectToken(ctx)
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
	te, err := tokenexchange.NewTokenExchangerClientCredentials(ctx, x.Issuer, x.ClientID, x.ClientSecret,
		tokenexchange.WithHTTPClient(b.http), tokenexchange.WithStaticTokenEndpoint(x.Issuer, x.TokenURL))
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
