package upstreamauth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/upstreamauth"
)

// TestClientIDMetadataDocument: an authorization server whose metadata
// says it takes Client ID Metadata Documents gets, as capgate's client
// id, the URL of the document capgate serves under its https public_url,
// and no registration; that document names the same id and capgate's
// redirect URI. (oidc-provider has no such documents, so this server is
// metadata only: the sign-in stops at its door.)
func TestClientIDMetadataDocument(t *testing.T) {
	ctx := context.Background()
	var registrations atomic.Int32
	mux := http.NewServeMux()
	as := httptest.NewServer(mux)
	defer as.Close()
	writeJSON := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+as.URL+`/prm"`)
		w.WriteHeader(http.StatusUnauthorized)
	})
	mux.HandleFunc("/prm", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"resource": as.URL + "/mcp", "authorization_servers": []string{as.URL}})
	})
	mux.HandleFunc("/.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"issuer": as.URL, "authorization_endpoint": as.URL + "/authorize", "token_endpoint": as.URL + "/token",
			"registration_endpoint": as.URL + "/register", "code_challenge_methods_supported": []string{"S256"},
			"client_id_metadata_document_supported": true})
	})
	mux.HandleFunc("/register", func(w http.ResponseWriter, r *http.Request) {
		registrations.Add(1)
		http.Error(w, "not expected", http.StatusBadRequest)
	})
	st, err := store.Open(ctx, t.TempDir(), store.Options{Key: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const public = "https://capgate.example"
	b, err := upstreamauth.New(upstreamauth.Options{PublicURL: public, Store: st,
		Servers: []upstreamauth.Server{{Name: "tracker", URL: as.URL + "/mcp", Mode: upstreamauth.ModeOAuth}}})
	if err != nil {
		t.Fatal(err)
	}
	link, _, err := b.Begin(ctx, "alice", "tracker")
	if err != nil {
		t.Fatal(err)
	}
	h := b.Handler()
	// The link page, then its button, in one browser.
	path := strings.TrimPrefix(link, public)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(rec.Body.String())
	if rec.Code != http.StatusOK || m == nil || len(rec.Result().Cookies()) == 0 {
		t.Fatalf("the link page: %d %s", rec.Code, rec.Body)
	}
	post := httptest.NewRequest(http.MethodPost, path, strings.NewReader(url.Values{"csrf": {m[1]}}.Encode()))
	post.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	post.AddCookie(rec.Result().Cookies()[0])
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, post)
	to, err := url.Parse(rec.Header().Get("Location"))
	if rec.Code != http.StatusSeeOther || err != nil || !strings.HasPrefix(to.String(), as.URL+"/authorize?") {
		t.Fatalf("the button: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	q := to.Query()
	const cimd = public + upstreamauth.ClientMetadataPath
	if q.Get("client_id") != cimd || q.Get("redirect_uri") != public+upstreamauth.CallbackPath ||
		q.Get("code_challenge_method") != "S256" || q.Get("resource") != as.URL+"/mcp" {
		t.Errorf("the authorization request: %v", q)
	}
	if n := registrations.Load(); n != 0 {
		t.Errorf("capgate registered %d times though the server takes its metadata document", n)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, upstreamauth.ClientMetadataPath, nil))
	var doc struct {
		ClientID     string   `json:"client_id"`
		RedirectURIs []string `json:"redirect_uris"`
		AuthMethod   string   `json:"token_endpoint_auth_method"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.ClientID != cimd ||
		!slices.Contains(doc.RedirectURIs, public+upstreamauth.CallbackPath) || doc.AuthMethod != "none" {
		t.Errorf("the metadata document: %d %s", rec.Code, rec.Body)
	}
}
