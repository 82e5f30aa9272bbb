package upstreamauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/oauth2"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// Linking an account: Begin records an auth flow in the store (the
// subject who asked, the PKCE verifier; single use, FlowTTL) and returns
// the link <public_url>/oauth/link/<flow id>. The link redirects the
// user's browser to the authorization server with the flow id as state
// (or shows the form for a user token); the server sends the browser back
// to <public_url>/oauth/callback, which takes the flow, so it works once,
// and stores the token for the flow's subject. The verifier never leaves
// capgate: only its S256 challenge is in the link.

// Paths under public_url.
const (
	CallbackPath = "/oauth/callback"
	LinkPath     = "/oauth/link/"
)

// flowState is what an auth flow keeps until its callback.
type flowState struct {
	Server   string    `json:"server"`
	Verifier string    `json:"verifier,omitempty"`
	ClientID string    `json:"client_id,omitempty"`
	Upstream *upstream `json:"upstream,omitempty"`
}

// Begin starts linking sub's account on server and returns the link the
// user opens, and until when it works.
func (b *Broker) Begin(ctx context.Context, sub, server string) (string, time.Time, error) {
	srv, ok := b.servers[server]
	if !ok {
		return "", time.Time{}, tool.Errorf(tool.CodeNotFound, "no mcp server %q signs in its users", server)
	}
	if sub == "" {
		return "", time.Time{}, tool.Errorf(tool.CodeInvalidInput, "linking an account needs a subject")
	}
	st := flowState{Server: srv.Name}
	switch srv.Mode {
	case ModeTokenExchange:
		return "", time.Time{}, tool.Errorf(tool.CodeInvalidInput,
			"mcp server %s uses token exchange: sign in to capgate through its OpenID provider; there is nothing to link", srv.Name)
	case ModeOAuth:
		up, err := b.upstreamOf(ctx, srv)
		if err != nil {
			return "", time.Time{}, err
		}
		reg, err := b.client(ctx, srv, up, "")
		if err != nil {
			return "", time.Time{}, err
		}
		st.Upstream, st.ClientID, st.Verifier = up, reg.ClientID, oauth2.GenerateVerifier()
	}
	raw, _ := json.Marshal(st)
	f, err := b.opts.Store.BeginFlow(ctx, sub, "mcp:"+srv.Name, "", raw)
	if err != nil {
		return "", time.Time{}, tool.Wrap(err, tool.CodeBackendUnavailable, "mcp server %s: starting the sign-in", srv.Name)
	}
	return b.opts.PublicURL + LinkPath + f.ID, f.ExpiresAt, nil
}

// Handler serves what users' browsers reach under public_url: the link,
// the callback, the user-token form and capgate's Client ID Metadata
// Document.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+LinkPath+"{flow}", b.serveLink)
	mux.HandleFunc("POST "+LinkPath+"{flow}", b.serveUserToken)
	mux.HandleFunc("GET "+CallbackPath, b.serveCallback)
	mux.HandleFunc("GET "+ClientMetadataPath, func(w http.ResponseWriter, r *http.Request) {
		id := b.clientMetadataURL()
		if id == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=3600")
		json.NewEncoder(w).Encode(b.clientMetadata(id))
	})
	return mux
}

// flowOf reads (or, take, consumes) the flow of a browser request.
func (b *Broker) flowOf(ctx context.Context, id string, take bool) (*store.Flow, *flowState, *Server, error) {
	var f *store.Flow
	var err error
	if take {
		f, err = b.opts.Store.TakeFlowByID(ctx, id)
	} else {
		f, err = b.opts.Store.FlowByID(ctx, id)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	var st flowState
	if err := json.Unmarshal(f.State, &st); err != nil {
		return nil, nil, nil, fmt.Errorf("flow %s: %w", id, err)
	}
	srv, ok := b.servers[st.Server]
	if !ok {
		return nil, nil, nil, fmt.Errorf("flow %s: server %q is no longer configured", id, st.Server)
	}
	return f, &st, srv, nil
}

func (b *Broker) serveLink(w http.ResponseWriter, r *http.Request) {
	f, st, srv, err := b.flowOf(r.Context(), r.PathValue("flow"), false)
	if err != nil {
		b.flowFailed(w, err)
		return
	}
	if srv.Mode == ModeUserToken {
		b.page(w, http.StatusOK, page{Title: "Your token for " + srv.Name, Server: srv.Name, Sub: f.Sub, Form: true,
			Header: headerName(srv)})
		return
	}
	cfg := (&registration{ClientID: st.ClientID}).config(st.Upstream, b.RedirectURI())
	http.Redirect(w, r, cfg.AuthCodeURL(f.ID, oauth2.S256ChallengeOption(st.Verifier),
		oauth2.SetAuthURLParam("resource", st.Upstream.Resource)), http.StatusFound)
}

func (b *Broker) serveCallback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, st, srv, err := b.flowOf(r.Context(), q.Get("state"), true)
	if err != nil {
		b.flowFailed(w, err)
		return
	}
	if e := q.Get("error"); e != "" {
		b.page(w, http.StatusBadRequest, page{Title: "Not signed in", Server: srv.Name, Sub: f.Sub,
			Text: "The sign-in was not completed (" + e + "). Ask for a new link and try again."})
		return
	}
	up := st.Upstream
	if iss := q.Get("iss"); up == nil || iss != "" && iss != up.Issuer {
		// RFC 9207: the answer came from another authorization server.
		b.page(w, http.StatusBadRequest, page{Title: "Not signed in", Server: srv.Name, Sub: f.Sub,
			Text: "The answer came from another authorization server than the one the sign-in began at."})
		return
	}
	ctx := r.Context()
	reg, err := b.client(ctx, srv, up, st.ClientID)
	if err != nil {
		b.opts.Logger.Warn("oauth callback: no client", "server", srv.Name, "err", tool.ErrorMessage(err))
		b.page(w, http.StatusBadGateway, page{Title: "Not signed in", Server: srv.Name, Sub: f.Sub, Text: tool.ErrorMessage(err)})
		return
	}
	tok, err := reg.config(up, b.RedirectURI()).Exchange(b.oauthContext(ctx, up), q.Get("code"), oauth2.VerifierOption(st.Verifier))
	if err != nil {
		b.opts.Logger.Warn("oauth callback: the code exchange failed", "server", srv.Name, "sub", f.Sub, "reason", oauthReason(err))
		b.page(w, http.StatusBadGateway, page{Title: "Not signed in", Server: srv.Name, Sub: f.Sub,
			Text: "The authorization server did not give capgate a token (" + oauthReason(err) + "). Ask for a new link and try again."})
		return
	}
	g := &grant{Server: srv.Name, AccessToken: tok.AccessToken, RefreshToken: tok.RefreshToken, TokenType: tok.TokenType,
		Expiry: tok.Expiry, ClientID: reg.ClientID, Account: accountOf(tok), LinkedAt: b.opts.Now().UTC()}
	capID, ref := tokenKey(up)
	if err := b.save(ctx, f.Sub, capID, ref, g); err != nil {
		b.opts.Logger.Error("oauth callback: the token could not be stored", "server", srv.Name, "sub", f.Sub, "err", err)
		b.page(w, http.StatusInternalServerError, page{Title: "Not signed in", Server: srv.Name, Sub: f.Sub,
			Text: "capgate could not store the token. Try again later."})
		return
	}
	b.opts.Logger.Info("upstream account linked", "server", srv.Name, "sub", f.Sub, "issuer", up.Issuer)
	b.linked(srv.Name)
	b.page(w, http.StatusOK, page{Title: "Signed in", Server: srv.Name, Sub: f.Sub, Account: g.Account, Linked: true})
}

// serveUserToken stores the token a user entered on the form.
func (b *Broker) serveUserToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	secret := strings.TrimSpace(r.PostFormValue("token"))
	id := r.PathValue("flow")
	f, _, srv, err := b.flowOf(r.Context(), id, false)
	if err != nil {
		b.flowFailed(w, err)
		return
	}
	if srv.Mode != ModeUserToken {
		http.Error(w, "this link signs in with the authorization server, not a form", http.StatusMethodNotAllowed)
		return
	}
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		b.page(w, http.StatusBadRequest, page{Title: "Your token for " + srv.Name, Server: srv.Name, Sub: f.Sub, Form: true,
			Header: headerName(srv), Text: "Enter the token: one line, not empty."})
		return
	}
	if f, _, srv, err = b.flowOf(r.Context(), id, true); err != nil {
		b.flowFailed(w, err)
		return
	}
	capID, ref := userTokenKey(srv)
	if err := b.save(r.Context(), f.Sub, capID, ref, &grant{Server: srv.Name, Secret: secret, LinkedAt: b.opts.Now().UTC()}); err != nil {
		b.opts.Logger.Error("user token could not be stored", "server", srv.Name, "sub", f.Sub, "err", err)
		b.page(w, http.StatusInternalServerError, page{Title: "Not saved", Server: srv.Name, Sub: f.Sub, Text: "capgate could not store the token. Try again later."})
		return
	}
	b.opts.Logger.Info("upstream user token stored", "server", srv.Name, "sub", f.Sub)
	b.linked(srv.Name)
	b.page(w, http.StatusOK, page{Title: "Saved", Server: srv.Name, Sub: f.Sub, Linked: true})
}

func (b *Broker) flowFailed(w http.ResponseWriter, err error) {
	if !errors.Is(err, store.ErrFlowInvalid) {
		b.opts.Logger.Warn("oauth link", "err", err)
	}
	b.page(w, http.StatusBadRequest, page{Title: "Link not valid",
		Text: "This sign-in link is unknown, expired (links last 10 minutes) or already used. Ask for a new one."})
}

// accountOf is the user's account name upstream, for the page that says
// what was linked: the access token's sub when it is a JWT. Read without
// verifying, for display only; nothing is decided on it.
func accountOf(tok *oauth2.Token) string {
	var claims jwt.MapClaims
	if _, _, err := jwt.NewParser().ParseUnverified(tok.AccessToken, &claims); err != nil {
		return ""
	}
	for _, k := range []string{"preferred_username", "email", "sub"} {
		if v, ok := claims[k].(string); ok && v != "" {
			return v
		}
	}
	return ""
}

func headerName(srv *Server) string {
	if srv.Header == "" {
		return "Authorization"
	}
	return srv.Header
}

// page is a plain page for the user's browser.
type page struct {
	Title, Server, Sub, Account, Text, Header string
	Linked, Form                              bool
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>capgate: {{.Title}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>{{.Title}}</h1>
{{if .Linked}}<p>capgate user <b>{{.Sub}}</b> is now linked to {{if .Account}}account <b>{{.Account}}</b> on {{else}}your account on {{end}}<b>{{.Server}}</b>.
Calls you make through capgate to {{.Server}} now act as that account, and no one else's calls do.</p>
<p>You can close this window and go back to your client.</p>{{end}}
{{if .Text}}<p>{{.Text}}</p>{{end}}
{{if .Form}}<p>capgate user <b>{{.Sub}}</b>: enter your own token for <b>{{.Server}}</b>. capgate keeps it encrypted and sends it as the {{.Header}} header of your calls only.</p>
<form method="post"><input type="password" name="token" autocomplete="off" required size="60"> <button type="submit">Save</button></form>{{end}}
</body></html>
`))

func (b *Broker) page(w http.ResponseWriter, status int, p page) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'; form-action 'self'")
	h.Set("X-Frame-Options", "DENY")
	w.WriteHeader(status)
	pageTmpl.Execute(w, p)
}
