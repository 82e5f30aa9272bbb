package token

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"golang.org/x/time/rate"
)

// Remote JWKS refresh: hourly, and on a kid the keys lack at most once a
// minute, so tokens with made-up kids cannot make capgate hammer the
// issuer. A fetch takes at most fetchTimeout.
const (
	refreshInterval   = time.Hour
	unknownKIDRefresh = time.Minute
	fetchTimeout      = 10 * time.Second
)

// remoteKeys is a JWKS fetched from a URL; keyfunc caches and refreshes it.
type remoteKeys struct {
	url    string
	kf     keyfunc.Keyfunc
	ctx    context.Context // ends the background refresh
	logger *slog.Logger
}

func newRemoteKeys(ctx context.Context, url string, client *http.Client, logger *slog.Logger) (*remoteKeys, error) {
	noFirstErr := false // an unreachable JWKS at startup fails the start
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{url}, keyfunc.Override{
		Client:                    client,
		HTTPTimeout:               fetchTimeout,
		NoErrorReturnFirstHTTPReq: &noFirstErr,
		RateLimitWaitMax:          fetchTimeout,
		RefreshInterval:           refreshInterval,
		RefreshUnknownKID:         rate.NewLimiter(rate.Every(unknownKIDRefresh), 1),
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(ctx context.Context, err error) {
				logger.WarnContext(ctx, "refreshing the JWKS failed; the keys fetched before stay in use", "url", u, "err", err)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("token: JWKS %s: %w", url, err)
	}
	r := &remoteKeys{url: url, kf: kf, ctx: ctx, logger: logger}
	if r.current(header{}) == nil {
		return nil, fmt.Errorf("token: JWKS %s has no key capgate can use", url)
	}
	return r, nil
}

// current is the keys as last fetched. When h names a kid they lack,
// keyfunc refetches the JWKS first (rate-limited). A key capgate cannot
// use is left out rather than failing every token.
func (r *remoteKeys) current(h header) []publicKey {
	st := r.kf.Storage()
	if h.hasKid {
		st.KeyRead(r.ctx, h.kid) // an unknown kid refreshes; the miss is reported below
	}
	jwks, err := st.KeyReadAll(r.ctx)
	if err != nil {
		return nil
	}
	var keys []publicKey
	for _, j := range jwks {
		k, err := keysOf(append(jwks[:0:0], j))
		if err != nil {
			continue
		}
		keys = append(keys, k...)
	}
	return keys
}

// discoveryPath is where an OpenID provider publishes its metadata.
const discoveryPath = "/.well-known/openid-configuration"

// Discover reads the OpenID provider metadata of issuer and returns its
// jwks_uri. The document must name the same issuer (OpenID Connect
// Discovery 1.0, section 4.3).
func Discover(ctx context.Context, client *http.Client, issuer string) (string, error) {
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	where := strings.TrimSuffix(issuer, "/") + discoveryPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
	if err != nil {
		return "", fmt.Errorf("token: OIDC discovery %s: %w", where, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("token: OIDC discovery: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token: OIDC discovery %s: HTTP %d", where, resp.StatusCode)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return "", fmt.Errorf("token: OIDC discovery %s: %w", where, err)
	}
	if doc.Issuer != issuer {
		return "", fmt.Errorf("token: OIDC discovery %s names issuer %q, not the configured %q", where, doc.Issuer, issuer)
	}
	if doc.JWKSURI == "" {
		return "", fmt.Errorf("token: OIDC discovery %s has no jwks_uri", where)
	}
	return doc.JWKSURI, nil
}
