package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	httphelper "github.com/zitadel/oidc/v3/pkg/http"
	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/capgate/capgate/audit"
)

// OIDC signs operators in with an OpenID provider: authorization code with
// PKCE (S256), the ID token verified by zitadel's relying party (issuer,
// audience, signature from the provider's JWKS, expiry, nonce-free code
// flow with a state cookie).
type OIDC struct {
	Issuer, ClientID, ClientSecret string
	// RedirectURL is <console URL>/oidc/callback, registered with the
	// provider.
	RedirectURL string
	Scopes      []string // default openid, profile, email

	mu sync.Mutex
	rp rp.RelyingParty // discovered on first use, so a provider down at start is no failure
}

// party returns the relying party, discovering the provider on first use.
func (c *Console) party(ctx context.Context) (rp.RelyingParty, error) {
	o := c.opts.OIDC
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rp != nil {
		return o.rp, nil
	}
	scopes := o.Scopes
	if len(scopes) == 0 {
		scopes = []string{oidc.ScopeOpenID, oidc.ScopeProfile, oidc.ScopeEmail}
	}
	copts := []httphelper.CookieHandlerOpt{httphelper.WithSameSite(http.SameSiteLaxMode), httphelper.WithMaxAge(int(LinkTTL.Seconds()))}
	if !c.opts.Secure {
		copts = append(copts, httphelper.WithUnsecure())
	}
	ck := httphelper.NewCookieHandler(derive(c.opts.Key, "oidc cookie hash"), derive(c.opts.Key, "oidc cookie block"), copts...)
	p, err := rp.NewRelyingPartyOIDC(ctx, o.Issuer, o.ClientID, o.ClientSecret, o.RedirectURL, scopes,
		rp.WithPKCE(ck), rp.WithCookieHandler(ck))
	if err != nil {
		return nil, fmt.Errorf("the OpenID provider %s: %w", o.Issuer, err)
	}
	o.rp = p
	return p, nil
}

func (c *Console) oidcStart(w http.ResponseWriter, r *http.Request) {
	if c.opts.OIDC == nil {
		http.NotFound(w, r)
		return
	}
	p, err := c.party(r.Context())
	if err != nil {
		c.opts.Logger.Warn("console: OpenID sign-in", "err", err)
		http.Redirect(w, r, "/signin?error="+url.QueryEscape("the OpenID provider cannot be reached; try again, or use `capgate console login`"), http.StatusSeeOther)
		return
	}
	rp.AuthURLHandler(randomToken, p)(w, r)
}

func (c *Console) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if c.opts.OIDC == nil {
		http.NotFound(w, r)
		return
	}
	p, err := c.party(r.Context())
	if err != nil {
		http.Redirect(w, r, "/signin?error="+url.QueryEscape("the OpenID provider cannot be reached"), http.StatusSeeOther)
		return
	}
	done := func(w http.ResponseWriter, r *http.Request, tokens *oidc.Tokens[*oidc.IDTokenClaims], state string, _ rp.RelyingParty) {
		claims := tokens.IDTokenClaims
		sub := claims.GetSubject()
		c.opts.Record(audit.Event{Type: audit.TypeOperator, Sub: sub, Decision: "sign_in", Detail: "console OpenID sign-in"})
		// Keep only claims that roles may name: never a token.
		kept := map[string]any{}
		for k, v := range claims.Claims {
			switch k {
			case "at_hash", "c_hash", "nonce", "azp", "sid":
				continue
			}
			kept[k] = v
		}
		if claims.Email != "" {
			kept["email"] = claims.Email
		}
		c.startSession(w, sub, kept)
		http.Redirect(w, r, "/approvals", http.StatusSeeOther)
	}
	rp.CodeExchangeHandler(done, p)(w, r)
}
