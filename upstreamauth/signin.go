package upstreamauth

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"golang.org/x/oauth2"

	"github.com/capgate/capgate/store"
)

// Browser sign-in (Options.SignIn): a link names the capgate user it
// links, but by itself cannot tell who opened it, so a link forwarded to
// someone else would link that person's account to the named user. With
// a sign-in configured, the link page first sends the browser to capgate's
// own OpenID provider ([auth.oidc] with a client_id). The answer, at
// <public_url>/oauth/signin, is checked like an upstream's callback (a
// state flow in the store, single use, bound by a cookie nonce to the
// browser that opened the link, PKCE S256), its ID token verified by
// zitadel's relying party; only when its subject is the link's is the
// browser sent back to the link with a pass (single use, bound to the
// browser by another nonce), and only then does the link show the page
// with the button, which alone sets the cookie the button's post must
// carry. Another subject gets a page saying so, and
// nothing is linked. The state lives in the store, not in cookies, so the
// sign-in may begin on one replica and end on another.

// SignInPath is where capgate's OpenID provider sends browsers back; the
// client's redirect URI is <public_url>/oauth/signin.
const SignInPath = "/oauth/signin"

// SignIn is capgate's client at its own OpenID provider, for browsers.
type SignIn struct {
	Issuer, ClientID, ClientSecret string
}

// signInParty is the relying party, discovered on first use, so a
// provider down at start is no failure.
type signInParty struct {
	mu sync.Mutex
	rp rp.RelyingParty
}

func (b *Broker) party(ctx context.Context) (rp.RelyingParty, error) {
	s := b.opts.SignIn
	b.signIn.mu.Lock()
	defer b.signIn.mu.Unlock()
	if b.signIn.rp != nil {
		return b.signIn.rp, nil
	}
	p, err := rp.NewRelyingPartyOIDC(ctx, s.Issuer, s.ClientID, s.ClientSecret, b.opts.PublicURL+SignInPath,
		[]string{oidc.ScopeOpenID}, rp.WithHTTPClient(b.http))
	if err != nil {
		return nil, fmt.Errorf("the OpenID provider %s: %w", s.Issuer, err)
	}
	b.signIn.rp = p
	return p, nil
}

func signInCookie(linkID string) string { return "capgate_signin_" + linkID }

// beginSignIn sends the browser that opened link flow f to capgate's
// OpenID provider, with a sign-in flow that comes back to f.
func (b *Broker) beginSignIn(w http.ResponseWriter, r *http.Request, f *store.Flow, srv *Server) {
	p, err := b.party(r.Context())
	if err != nil {
		b.opts.Logger.Warn("oauth link: capgate's OpenID provider", "server", srv.Name, "err", err)
		b.page(w, http.StatusBadGateway, page{Title: "Not signed in", Server: srv.Name,
			Text: "capgate cannot reach its sign-in to check who you are. Try the link again later."})
		return
	}
	nonce, verifier := newID(), oauth2.GenerateVerifier()
	st := flowState{Server: srv.Name, Link: f.ID, Verifier: verifier, Browser: hashHex(nonce), Cookie: signInCookie(f.ID)}
	raw, _ := json.Marshal(st)
	sf, err := b.opts.Store.BeginFlow(r.Context(), f.Sub, f.CapabilityID, "", raw)
	if err != nil {
		b.opts.Logger.Error("oauth link: the sign-in could not be recorded", "server", srv.Name, "sub", f.Sub, "err", err)
		b.page(w, http.StatusInternalServerError, page{Title: "Not signed in", Server: srv.Name, Text: "capgate could not start the sign-in. Try again later."})
		return
	}
	b.setCookie(w, st.Cookie, nonce, sf.ExpiresAt)
	http.Redirect(w, r, rp.AuthURL(sf.ID, p, rp.WithCodeChallenge(oauth2.S256ChallengeFromVerifier(verifier))), http.StatusSeeOther)
}

// serveSignIn is the OpenID provider's answer: the link's page when the
// browser signed in as the subject the link is for.
func (b *Broker) serveSignIn(w http.ResponseWriter, r *http.Request) {
	if b.opts.SignIn == nil {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	// Only a sign-in's state comes back here.
	f, st, srv, ok := b.takeBrowserFlow(w, r, "oauth link sign-in", func(st *flowState) bool { return st.Link != "" && !st.SignedIn },
		"This sign-in was begun in another browser. Nothing was linked. Open your own link.")
	if !ok {
		return
	}
	if e := q.Get("error"); e != "" {
		b.page(w, http.StatusBadRequest, page{Title: "Not signed in", Server: srv.Name,
			Text: "The sign-in to capgate was not completed (" + e + "). Nothing was linked. Open the link again to retry."})
		return
	}
	p, err := b.party(r.Context())
	var tokens *oidc.Tokens[*oidc.IDTokenClaims]
	if err == nil {
		tokens, err = rp.CodeExchange[*oidc.IDTokenClaims](r.Context(), q.Get("code"), p, rp.WithCodeVerifier(st.Verifier))
	}
	if err != nil || tokens.IDTokenClaims == nil {
		// The error may quote the provider's answer; only its kind is kept.
		b.opts.Logger.Warn("oauth link: the sign-in to capgate failed", "server", srv.Name, "sub", f.Sub, "reason", oauthReason(err))
		b.page(w, http.StatusBadGateway, page{Title: "Not signed in", Server: srv.Name,
			Text: "capgate could not confirm who signed in. Nothing was linked. Open the link again to retry."})
		return
	}
	if who := tokens.IDTokenClaims.GetSubject(); who != f.Sub {
		b.opts.Logger.Warn("oauth link: refused, the browser signed in as another subject than the link is for",
			"server", srv.Name, "sub", f.Sub, "signed_in", who)
		b.page(w, http.StatusForbidden, page{Title: "Not your link", Server: srv.Name, Sub: f.Sub, SignedIn: who, Other: true})
		return
	}
	// Back to the link, with a pass for this browser.
	nonce := newID()
	raw, _ := json.Marshal(flowState{Server: srv.Name, Link: st.Link, SignedIn: true, Browser: hashHex(nonce), Cookie: st.Cookie})
	pass, err := b.opts.Store.BeginFlow(r.Context(), f.Sub, f.CapabilityID, "", raw)
	if err != nil {
		b.opts.Logger.Error("oauth link: the sign-in could not be recorded", "server", srv.Name, "sub", f.Sub, "err", err)
		b.page(w, http.StatusInternalServerError, page{Title: "Not signed in", Server: srv.Name, Text: "capgate could not record the sign-in. Try again later."})
		return
	}
	b.setCookie(w, st.Cookie, nonce, pass.ExpiresAt)
	http.Redirect(w, r, LinkPath+st.Link+"?signin="+pass.ID, http.StatusSeeOther)
}

// signedIn reports whether r, opening link flow f, carries the pass of a
// sign-in as f's subject made in this browser, and uses it up. Without
// one, the link signs the browser in first.
func (b *Broker) signedIn(r *http.Request, f *store.Flow) bool {
	id := r.URL.Query().Get("signin")
	if id == "" {
		return false
	}
	pf, st, _, err := b.flowOf(r.Context(), id, false)
	if err != nil || !st.SignedIn || st.Link != f.ID || pf.Sub != f.Sub || !sameBrowser(r, st) {
		return false
	}
	_, err = b.opts.Store.TakeFlowByID(r.Context(), id)
	return err == nil
}
