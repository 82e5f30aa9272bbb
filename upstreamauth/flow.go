package upstreamauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
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

// Linking an account: Begin records a link flow in the store (the subject
// who asked, the server; single use, FlowTTL) and returns the link
// <public_url>/oauth/link/<flow id>. The link shows a page naming the
// capgate user and the server, and sets a cookie holding a random nonce
// in the browser that opened it; its button posts that nonce back. The
// post (which must carry the cookie and the same nonce, so no other site
// can make a browser submit it) consumes the link flow and begins a sign-in
// flow whose state holds the PKCE verifier and a hash of the nonce, and
// sends the browser to the authorization server with that flow's id as
// state. The callback completes only in the browser holding the nonce
// (RFC 6749 §10.12: state bound to the user agent), consumes the flow, so
// it works once, and stores the token for the flow's subject. Flow states
// are sealed in the store; the verifier never leaves capgate: only its
// S256 challenge is in the redirect.

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
	// Browser is the hex SHA-256 of the nonce in the cookie named Cookie
	// of the browser that began the sign-in; set on sign-in flows only,
	// never on link flows.
	Browser string `json:"browser,omitempty"`
	Cookie  string `json:"cookie,omitempty"`
	// Link is the link flow a sign-in to capgate itself (SignIn) goes back
	// to; set on those only. SignedIn marks the pass such a sign-in, once
	// done for the link's subject, gives that browser back to the link.
	Link     string `json:"link,omitempty"`
	SignedIn bool   `json:"signed_in,omitempty"`
}

// Begin starts linking sub's account on server and returns the link the
// user opens, and until when it works.
func (b *Broker) Begin(ctx context.Context, sub, server string) (string, time.Time, error) {
	srv, ok := b.server(server)
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
		st.Upstream, st.ClientID = up, reg.ClientID
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
	mux.HandleFunc("POST "+LinkPath+"{flow}", b.servePost)
	mux.HandleFunc("GET "+CallbackPath, b.serveCallback)
	mux.HandleFunc("GET "+SignInPath, b.serveSignIn)
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
	srv, ok := b.server(st.Server)
	if !ok {
		return nil, nil, nil, fmt.Errorf("flow %s: server %q is no longer configured", id, st.Server)
	}
	return f, &st, srv, nil
}

// linkCookie is the cookie that ties a link's sign-in to the browser
// that opened it.
func linkCookie(flowID string) string { return "capgate_link_" + flowID }

func hashHex(v string) string {
	h := sha256.Sum256([]byte(v))
	return hex.EncodeToString(h[:])
}

// serveLink shows the page a link opens: which capgate user is linked to
// which server, and the button (or, for a user token, the form) that goes
// on, with a fresh nonce in a cookie and in the form. With a browser
// sign-in (SignIn) that page comes only after the browser signed in as
// the link's subject (signin.go).
func (b *Broker) serveLink(w http.ResponseWriter, r *http.Request) {
	f, st, srv, err := b.flowOf(r.Context(), r.PathValue("flow"), false)
	if err == nil && st.Browser != "" {
		err = store.ErrFlowInvalid // a sign-in flow's id is no link
	}
	if err != nil {
		b.flowFailed(w, err)
		return
	}
	if b.opts.SignIn != nil && !b.signedIn(r, f) {
		b.beginSignIn(w, r, f, srv)
		return
	}
	b.showLink(w, f, srv)
}

// showLink writes link flow f's page, whose button's post must carry the
// nonce it sets in a cookie.
func (b *Broker) showLink(w http.ResponseWriter, f *store.Flow, srv *Server) {
	nonce := newID()
	b.setCookie(w, linkCookie(f.ID), nonce, f.ExpiresAt)
	p := page{Title: "Link your account on " + srv.Name, Server: srv.Name, Sub: f.Sub, CSRF: nonce, Header: headerName(srv),
		Action: LinkPath + f.ID}
	if srv.Mode == ModeUserToken {
		p.Title, p.Form = "Your token for "+srv.Name, true
	} else {
		p.Confirm = true
	}
	b.page(w, http.StatusOK, p)
}

// fromOpener reports whether r, a post on link flow id, comes from the
// page the link showed in this browser: the form's nonce is the cookie's.
func fromOpener(r *http.Request, id string) bool {
	c, err := r.Cookie(linkCookie(id))
	form := r.PostFormValue("csrf")
	return err == nil && c.Value != "" && form != "" && subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) == 1
}

// servePost goes on from the link's page: to the authorization server, or
// storing the user token entered.
func (b *Broker) servePost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	id := r.PathValue("flow")
	f, st, srv, err := b.flowOf(r.Context(), id, false)
	if err == nil && st.Browser != "" {
		err = store.ErrFlowInvalid
	}
	if err != nil {
		b.flowFailed(w, err)
		return
	}
	if !fromOpener(r, id) {
		b.opts.Logger.Warn("oauth link: a post without the link page's nonce refused", "server", srv.Name, "sub", f.Sub)
		b.page(w, http.StatusForbidden, page{Title: "Not linked", Server: srv.Name,
			Text: "This form must be sent from the page the link opened, in the same browser. Open the link again."})
		return
	}
	if srv.Mode == ModeUserToken {
		b.serveUserToken(w, r, f, srv)
		return
	}
	if f, err = b.opts.Store.TakeFlowByID(r.Context(), id); err != nil {
		b.flowFailed(w, err)
		return
	}
	c, _ := r.Cookie(linkCookie(id))
	next := flowState{Server: st.Server, ClientID: st.ClientID, Upstream: st.Upstream, Verifier: oauth2.GenerateVerifier(),
		Browser: hashHex(c.Value), Cookie: linkCookie(id)}
	raw, _ := json.Marshal(next)
	sf, err := b.opts.Store.BeginFlow(r.Context(), f.Sub, f.CapabilityID, "", raw)
	if err != nil {
		b.opts.Logger.Error("oauth link: the sign-in could not be recorded", "server", srv.Name, "sub", f.Sub, "err", err)
		b.page(w, http.StatusInternalServerError, page{Title: "Not signed in", Server: srv.Name, Text: "capgate could not start the sign-in. Try again later."})
		return
	}
	cfg := (&registration{ClientID: next.ClientID}).config(next.Upstream, b.RedirectURI())
	http.Redirect(w, r, cfg.AuthCodeURL(sf.ID, oauth2.S256ChallengeOption(next.Verifier),
		oauth2.SetAuthURLParam("resource", next.Upstream.Resource)), http.StatusSeeOther)
}

// takeBrowserFlow takes the flow r's state names, of the kind valid
// accepts, when r comes from the browser that began it; else it writes
// the page that says why (refused: the refusal's text) and reports false.
// Login CSRF: an answer another browser (or site) brings is refused, and
// the flow stays for the browser that began it. what names the step in
// the log.
func (b *Broker) takeBrowserFlow(w http.ResponseWriter, r *http.Request, what string, valid func(*flowState) bool, refused string) (*store.Flow, *flowState, *Server, bool) {
	id := r.URL.Query().Get("state")
	f, st, srv, err := b.flowOf(r.Context(), id, false)
	if err == nil && !valid(st) {
		err = store.ErrFlowInvalid
	}
	if err != nil {
		b.flowFailed(w, err)
		return nil, nil, nil, false
	}
	if !sameBrowser(r, st) {
		b.opts.Logger.Warn(what+": the answer came to another browser than the one that began the sign-in; refused",
			"server", srv.Name, "sub", f.Sub)
		b.page(w, http.StatusForbidden, page{Title: "Not signed in", Server: srv.Name, Text: refused})
		return nil, nil, nil, false
	}
	if f, err = b.opts.Store.TakeFlowByID(r.Context(), id); err != nil {
		b.flowFailed(w, err)
		return nil, nil, nil, false
	}
	return f, st, srv, true
}

// setCookie sets one of the sign-in's cookies, for /oauth/ only, until
// expires (zero: deleted).
func (b *Broker) setCookie(w http.ResponseWriter, name, value string, expires time.Time) {
	c := &http.Cookie{Name: name, Value: value, Path: "/oauth/", Expires: expires, HttpOnly: true,
		Secure: strings.HasPrefix(b.opts.PublicURL, "https:"), SameSite: http.SameSiteLaxMode}
	if expires.IsZero() {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

// sameBrowser reports whether r comes from the browser that began
// sign-in flow st: its cookie holds the nonce whose hash st keeps.
func sameBrowser(r *http.Request, st *flowState) bool {
	c, err := r.Cookie(st.Cookie)
	return err == nil && subtle.ConstantTimeCompare([]byte(hashHex(c.Value)), []byte(st.Browser)) == 1
}

func (b *Broker) serveCallback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// A link's or a capgate sign-in's id is no state here.
	f, st, srv, ok := b.takeBrowserFlow(w, r, "oauth callback", func(st *flowState) bool { return st.Browser != "" && st.Link == "" },
		"This sign-in was begun in another browser. Nothing was linked. Open your own link to sign in.")
	if !ok {
		return
	}
	b.setCookie(w, st.Cookie, "", time.Time{})
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
	b.linked(f.Sub, srv.Name)
	b.page(w, http.StatusOK, page{Title: "Signed in", Server: srv.Name, Sub: f.Sub, Account: g.Account, Linked: true})
}

// serveUserToken stores the token a user entered on the form of link
// flow f, which fromOpener checked.
func (b *Broker) serveUserToken(w http.ResponseWriter, r *http.Request, f *store.Flow, srv *Server) {
	secret := strings.TrimSpace(r.PostFormValue("token"))
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		b.page(w, http.StatusBadRequest, page{Title: "Your token for " + srv.Name, Server: srv.Name, Sub: f.Sub, Form: true,
			Header: headerName(srv), CSRF: r.PostFormValue("csrf"), Text: "Enter the token: one line, not empty."})
		return
	}
	f, err := b.opts.Store.TakeFlowByID(r.Context(), f.ID)
	if err != nil {
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
	b.linked(f.Sub, srv.Name)
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
	CSRF                                      string // the link page's nonce, posted back
	Action                                    string // where the form posts
	SignedIn                                  string // who signed in, when Other
	Linked, Form, Confirm                     bool
	Other                                     bool // signed in as another subject than the link's
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
{{if .Other}}<p>This link is for capgate user <b>{{.Sub}}</b>, and you signed in as <b>{{.SignedIn}}</b>. Nothing was linked.</p>
<p>Only <b>{{.Sub}}</b> can use it. If someone sent it to you, do not sign in to {{.Server}} through it; to link your own account, ask for a link of your own.</p>{{end}}
{{if .Form}}<p>capgate user <b>{{.Sub}}</b>: enter your own token for <b>{{.Server}}</b>. capgate keeps it encrypted and sends it as the {{.Header}} header of your calls only.</p>
<form method="post"{{if .Action}} action="{{.Action}}"{{end}}><input type="hidden" name="csrf" value="{{.CSRF}}"><input type="password" name="token" autocomplete="off" required size="60"> <button type="submit">Save</button></form>{{end}}
{{if .Confirm}}<p>This links capgate user <b>{{.Sub}}</b> to the account you sign in with on <b>{{.Server}}</b>: calls <b>{{.Sub}}</b> makes through capgate will act as that account.
If you are not <b>{{.Sub}}</b>, or did not ask for this link, close this window.</p>
<form method="post" action="{{.Action}}"><input type="hidden" name="csrf" value="{{.CSRF}}"><button type="submit">Sign in to {{.Server}}</button></form>{{end}}
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
