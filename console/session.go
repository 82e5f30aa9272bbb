package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gorilla/securecookie"
)

// A role is what a signed-in operator may do.
type role int

const (
	nobody role = iota
	viewer
	approver
)

func (r role) String() string {
	switch r {
	case approver:
		return "approver"
	case viewer:
		return "viewer"
	}
	return "none"
}

// Roles says who may use the console: each entry is a subject, or
// "claim=value" matched against the OpenID provider's ID token claims
// (a list claim matches when it holds the value). Everyone else is refused.
type Roles struct {
	Approvers, Viewers []string
}

// of returns the role of sub with claims; approvers also view.
func (rs Roles) of(sub string, claims map[string]any) role {
	switch {
	case sub == "":
		return nobody
	case matchAny(rs.Approvers, sub, claims):
		return approver
	case matchAny(rs.Viewers, sub, claims):
		return viewer
	}
	return nobody
}

func matchAny(entries []string, sub string, claims map[string]any) bool {
	for _, e := range entries {
		name, value, isClaim := strings.Cut(e, "=")
		if !isClaim {
			if e == sub {
				return true
			}
			continue
		}
		switch v := claims[name].(type) {
		case string:
			if v == value {
				return true
			}
		case []any:
			if slices.ContainsFunc(v, func(x any) bool { s, ok := x.(string); return ok && s == value }) {
				return true
			}
		}
	}
	return false
}

// session is what the console's cookie carries, encrypted and
// authenticated by securecookie: who signed in, their claims (for roles
// decided anew on every request, so that a reload that removes an
// operator takes effect at once), the CSRF token of their forms and when
// the session ends.
type session struct {
	Sub     string         `json:"sub"`
	Claims  map[string]any `json:"claims,omitempty"`
	CSRF    string         `json:"csrf"`
	Expires int64          `json:"exp"`
}

const (
	cookieName = "capgate_console"
	// sessionTTL bounds a session: an operator signs in again each day.
	sessionTTL = 12 * time.Hour
	// LinkTTL is how long a sign-in link from `capgate console login` lives.
	LinkTTL = 10 * time.Minute
)

// keys are the console's keys, each derived from capgate's own secret for
// one use, so that none of them is the token key.
type keys struct {
	cookie *securecookie.SecureCookie
	link   []byte
}

func derive(master []byte, use string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("capgate console " + use))
	return m.Sum(nil)
}

func deriveKeys(master []byte) keys {
	sc := securecookie.New(derive(master, "cookie hash"), derive(master, "cookie block"))
	sc.MaxAge(int(sessionTTL / time.Second))
	sc.SetSerializer(securecookie.JSONEncoder{})
	return keys{cookie: sc, link: derive(master, "link")}
}

// startSession sets the session cookie for sub.
func (c *Console) startSession(w http.ResponseWriter, sub string, claims map[string]any) {
	s := session{Sub: sub, Claims: claims, CSRF: randomToken(), Expires: c.opts.Now().Add(sessionTTL).Unix()}
	v, err := c.keys.cookie.Encode(cookieName, s)
	if err != nil {
		c.opts.Logger.Error("console: session cookie", "err", err)
		http.Error(w, "500 session", http.StatusInternalServerError)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: v, Path: "/", HttpOnly: true, Secure: c.opts.Secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL / time.Second)})
}

// current returns the request's session, if it has a valid one.
func (c *Console) current(r *http.Request) (*session, bool) {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil, false
	}
	var s session
	if err := c.keys.cookie.Decode(cookieName, ck.Value, &s); err != nil {
		return nil, false
	}
	if s.Sub == "" || c.opts.Now().Unix() >= s.Expires {
		return nil, false
	}
	return &s, true
}

type ctxKey struct{}

// visitor is the signed-in operator a handler serves.
type visitor struct {
	*session
	Role role
}

func visitorOf(ctx context.Context) *visitor { v, _ := ctx.Value(ctxKey{}).(*visitor); return v }

// need wraps h so that it runs only for an operator of at least role min.
// A visitor who is not signed in is sent to the sign-in page (a GET) or
// refused (anything else); one without the role gets 403. Every POST must
// carry the session's CSRF token.
func (c *Console) need(min role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.current(r)
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/signin", http.StatusSeeOther)
				return
			}
			http.Error(w, "401 sign in first", http.StatusUnauthorized)
			return
		}
		v := &visitor{session: s, Role: c.opts.Roles.of(s.Sub, s.Claims)}
		if v.Role < min {
			w.WriteHeader(http.StatusForbidden)
			c.render(w, r, "refused", v, map[string]any{"Need": min.String()})
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				http.Error(w, "400 bad form", http.StatusBadRequest)
				return
			}
			got := r.PostForm.Get("csrf")
			if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) != 1 {
				http.Error(w, "403 the form's CSRF token is missing or wrong: reload the page and try again", http.StatusForbidden)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, v)))
	}
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// link is a sign-in link's signed payload.
type link struct {
	Sub     string `json:"sub"`
	Expires int64  `json:"exp"`
	Nonce   string `json:"n"`
}

// SignInLink returns the token of a single-use sign-in link for sub,
// valid for LinkTTL, signed with the console's link key (derived from key,
// capgate's own secret). The console accepts it once, on any replica that
// shares the store.
func SignInLink(key []byte, sub string, now time.Time) (string, error) {
	if sub == "" {
		return "", errors.New("console: a sign-in link needs a subject")
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	payload, err := json.Marshal(link{Sub: sub, Expires: now.Add(LinkTTL).Unix(), Nonce: hex.EncodeToString(nonce)})
	if err != nil {
		return "", err
	}
	k := deriveKeys(key).link
	m := hmac.New(sha256.New, k)
	m.Write(payload)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

// errLink is every refusal of a sign-in link: the visitor is told only that
// it is not valid (any more).
var errLink = errors.New("this sign-in link is not valid: it is wrong, expired or already used; run `capgate console login` for a new one")

// takeLink checks a sign-in link's token and consumes it.
func (c *Console) takeLink(ctx context.Context, tok string) (string, error) {
	p, sig, ok := strings.Cut(tok, ".")
	if !ok {
		return "", errLink
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	mac, err2 := base64.RawURLEncoding.DecodeString(sig)
	if err1 != nil || err2 != nil {
		return "", errLink
	}
	m := hmac.New(sha256.New, c.keys.link)
	m.Write(payload)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return "", errLink
	}
	var l link
	if err := json.Unmarshal(payload, &l); err != nil || l.Sub == "" || l.Nonce == "" {
		return "", errLink
	}
	exp := time.Unix(l.Expires, 0)
	if !c.opts.Now().Before(exp) {
		return "", errLink
	}
	if c.opts.ClaimOnce == nil {
		return "", fmt.Errorf("console: no store to consume sign-in links in")
	}
	if err := c.opts.ClaimOnce(ctx, "console-link:"+l.Nonce, exp); err != nil {
		return "", errLink
	}
	return l.Sub, nil
}
