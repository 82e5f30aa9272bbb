package upstreamauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// Account is what may be shown of one user's link to one server: never
// the token.
type Account struct {
	Server   string    `json:"server"`
	Mode     Mode      `json:"auth"`
	Linked   bool      `json:"linked"`
	Account  string    `json:"account,omitempty"` // the user's account upstream, when known
	LinkedAt time.Time `json:"linked_at,omitzero"`
	Expiry   time.Time `json:"expiry,omitzero"` // of the access token held now
	// Refreshable: a refresh token is held.
	Refreshable bool `json:"refreshable,omitempty"`
}

// Status says whether sub has linked an account on server.
func (b *Broker) Status(ctx context.Context, sub, server string) (Account, error) {
	srv, ok := b.server(server)
	if !ok {
		return Account{}, tool.Errorf(tool.CodeNotFound, "no mcp server %q signs in its users", server)
	}
	a := Account{Server: srv.Name, Mode: srv.Mode}
	var g *grant
	var err error
	switch srv.Mode {
	case ModeTokenExchange:
		// Nothing to link: a caller signed in through [auth.oidc] has it.
		return a, nil
	case ModeUserToken:
		capID, ref := userTokenKey(srv)
		g, err = b.load(ctx, sub, capID, ref)
	default:
		var up *upstream
		if up, err = b.upstreamOf(ctx, srv); err != nil {
			return a, err
		}
		capID, ref := tokenKey(up)
		g, err = b.load(ctx, sub, capID, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return a, nil
	}
	if err != nil {
		return a, storeError(srv, err)
	}
	a.Linked, a.Account, a.LinkedAt, a.Expiry, a.Refreshable = true, g.Account, g.LinkedAt, g.Expiry, g.RefreshToken != ""
	return a, nil
}

// Accounts lists sub's link to every server, by server name.
func (b *Broker) Accounts(ctx context.Context, sub string) ([]Account, error) {
	names := b.names()
	out := make([]Account, 0, len(names))
	for _, n := range names {
		a, err := b.Status(ctx, sub, n)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Revoke forgets sub's credential for server, and first asks the
// authorization server to revoke its tokens (RFC 7009) when it has a
// revocation endpoint. It says whether the authorization server
// confirmed; a credential that was not there is ErrNotFound.
func (b *Broker) Revoke(ctx context.Context, sub, server string) (bool, error) {
	srv, ok := b.server(server)
	if !ok {
		return false, tool.Errorf(tool.CodeNotFound, "no mcp server %q signs in its users", server)
	}
	if srv.Mode == ModeUserToken {
		capID, ref := userTokenKey(srv)
		return false, b.opts.Store.DeleteCredential(ctx, sub, capID, ref)
	}
	if srv.Mode == ModeTokenExchange {
		b.forgetExchanged(sub, srv.Name)
		return false, nil
	}
	up, err := b.upstreamOf(ctx, srv)
	if err != nil {
		return false, err
	}
	capID, ref := tokenKey(up)
	g, err := b.load(ctx, sub, capID, ref)
	if err != nil {
		return false, err
	}
	confirmed := false
	if up.RevokeEndpoint != "" {
		// The refresh token when there is one: revoking it ends the grant,
		// and with it (RFC 7009 §2.1) the grant's access tokens; a JWT
		// access token alone often cannot be revoked.
		tok, hint := g.RefreshToken, "refresh_token"
		if tok == "" {
			tok, hint = g.AccessToken, "access_token"
		}
		if reg, err := b.client(ctx, srv, up, g.ClientID); err == nil && tok != "" {
			if err := b.revoke(ctx, up, reg, tok, hint); err != nil {
				b.opts.Logger.Warn("the authorization server did not confirm a revocation", "server", srv.Name, "sub", sub,
					"token_type_hint", hint, "err", err)
			} else {
				confirmed = true
			}
		}
	}
	if err := b.opts.Store.DeleteCredential(ctx, sub, capID, ref); err != nil {
		return confirmed, err
	}
	b.opts.Logger.Info("upstream account unlinked", "server", srv.Name, "sub", sub, "revoked_upstream", confirmed)
	return confirmed, nil
}

// revoke posts one token to the revocation endpoint. Its error never
// carries the token.
func (b *Broker) revoke(ctx context.Context, up *upstream, reg *registration, token, hint string) error {
	form := url.Values{"token": {token}, "token_type_hint": {hint}}
	if reg.ClientSecret == "" || reg.AuthMethod == "client_secret_post" {
		form.Set("client_id", reg.ClientID)
		if reg.ClientSecret != "" {
			form.Set("client_secret", reg.ClientSecret)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.RevokeEndpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("revocation endpoint: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if reg.ClientSecret != "" && reg.AuthMethod != "client_secret_post" {
		req.SetBasicAuth(url.QueryEscape(reg.ClientID), url.QueryEscape(reg.ClientSecret))
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return errors.New("revocation endpoint unreachable")
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("revocation endpoint answered HTTP %d", resp.StatusCode)
	}
	return nil
}

// userTokenHeader is sub's own token for srv, as its header.
func (b *Broker) userTokenHeader(ctx context.Context, sub string, srv *Server, stale string) (http.Header, error) {
	capID, ref := userTokenKey(srv)
	g, err := b.load(ctx, sub, capID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, b.needLink(ctx, sub, srv, "no token entered")
	}
	if err != nil {
		return nil, storeError(srv, err)
	}
	h := http.Header{}
	if name := headerName(srv); strings.EqualFold(name, "Authorization") {
		h.Set(name, "Bearer "+g.Secret)
	} else {
		h.Set(name, g.Secret)
	}
	if stale != "" && stale == h.Get(headerName(srv)) {
		// Refused upstream: the user enters another.
		b.opts.Store.DeleteCredential(ctx, sub, capID, ref)
		return nil, b.needLink(ctx, sub, srv, "the server refused the token you entered")
	}
	return h, nil
}

// Linked is one subject's account on one server, for an operator's list.
type Linked struct {
	Sub string
	Account
}

// AllLinked lists every subject's linked account on every server, up to
// limit per server, the most recently linked first: the operator's view
// (the console's accounts page). Token exchange holds nothing to list.
func (b *Broker) AllLinked(ctx context.Context, limit int) ([]Linked, error) {
	names := b.names()
	var out []Linked
	for _, n := range names {
		srv, ok := b.server(n)
		if !ok {
			continue // reloaded away meanwhile
		}
		var capID, ref string
		switch srv.Mode {
		case ModeTokenExchange:
			continue
		case ModeUserToken:
			capID, ref = userTokenKey(srv)
		default:
			up, err := b.upstreamOf(ctx, srv)
			if err != nil {
				// Not discovered yet: nobody can have linked it.
				continue
			}
			capID, ref = tokenKey(up)
		}
		subs, err := b.opts.Store.CredentialSubjects(ctx, capID, ref, limit)
		if err != nil {
			return nil, storeError(srv, err)
		}
		for _, sub := range subs {
			a, err := b.Status(ctx, sub, n)
			if err != nil {
				return nil, err
			}
			if a.Linked {
				out = append(out, Linked{Sub: sub, Account: a})
			}
		}
	}
	return out, nil
}
