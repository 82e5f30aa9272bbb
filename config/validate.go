package config

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capgate/capgate/internal/suggest"
	"github.com/capgate/capgate/permissions"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

var (
	// Server names and prefixes become part of tool ids and exposed names.
	serverName  = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	prefixChars = regexp.MustCompile(`^[a-zA-Z0-9_-]*$`)
	// Bridge namespaces, as Ash's capability ids require.
	namespaceRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	upperEnv    = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
)

// isLoopback reports a host that only this machine can reach.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkHTTPURL refuses a URL that is not https, or http to a loopback
// host: keys fetched in the clear could be anyone's.
func checkHTTPURL(key, raw string, fail func(key, format string, args ...any)) {
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "":
		fail(key, "%q is not an absolute URL", raw)
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopback(u.Hostname()):
	default:
		fail(key, "%q: must be https (http only to a loopback host)", raw)
	}
}

// didYouMean is " (did you mean X?)" for the known word nearest to a
// mistyped one, or "" when none is near.
func didYouMean(s string, known []string) string {
	if n := suggest.Nearest(s, known); n != "" {
		return fmt.Sprintf(" (did you mean %s?)", n)
	}
	return ""
}

func sortProviders(p []NamedProvider) {
	sort.Slice(p, func(i, j int) bool { return p[i].Key < p[j].Key })
}

func (c *Config) validate(fail func(key, format string, args ...any)) {
	c.Discovery.validate(fail)
	if u := c.Store.URL; u != "" && !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
		// Not quoted: it may hold a password.
		fail("store.url", "want a postgres:// or postgresql:// URL")
	}
	if _, _, err := net.SplitHostPort(c.Server.Listen); err != nil {
		fail("server.listen", "%q is not host:port", c.Server.Listen)
	}
	if raw := c.Server.AdvertiseURL; raw != "" {
		// Replicas talk on the operator's network: http is allowed there.
		if u, err := url.Parse(raw); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			fail("server.advertise_url", "%q is not an absolute http or https URL", raw)
		}
	}
	if raw := c.Server.PublicURL; raw != "" {
		if u, err := url.Parse(raw); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.RawQuery != "" || u.Fragment != "" {
			fail("server.public_url", "%q is not an absolute http or https URL without query", raw)
		}
	}
	if !upperEnv.MatchString(c.Auth.SecretEnv) {
		fail("auth.secret_env", "%q is not an environment variable name", c.Auth.SecretEnv)
	}
	keySources := 0
	for _, set := range []bool{c.Auth.JWKSFile != "", c.Auth.JWKSURL != "", c.Auth.OIDC != nil} {
		if set {
			keySources++
		}
	}
	if c.Auth.AllowHS256 != nil && !*c.Auth.AllowHS256 && keySources == 0 {
		fail("auth.allow_hs256", "false with no auth.jwks_file, jwks_url or oidc leaves no key to verify a token: set one, or remove allow_hs256")
	}
	if keySources > 1 {
		fail("auth", "set one of jwks_file, jwks_url and [auth.oidc], not several")
	}
	if c.Auth.JWKSURL != "" {
		checkHTTPURL("auth.jwks_url", c.Auth.JWKSURL, fail)
	}
	if o := c.Auth.OIDC; o != nil {
		if o.Issuer == "" {
			fail("auth.oidc.issuer", "required: the issuer's URL, exactly as its tokens' iss says it")
		} else {
			checkHTTPURL("auth.oidc.issuer", o.Issuer, fail)
		}
		if o.ClientID != "" && c.Server.PublicURL == "" {
			fail("auth.oidc.client_id", "signing browsers in needs server.public_url: the redirect URI is <public_url>/oauth/signin")
		}
		if o.ClientSecretEnv != "" && o.ClientID == "" {
			fail("auth.oidc.client_secret_env", "is the secret of client_id, which is not set")
		} else if o.ClientSecretEnv != "" && !upperEnv.MatchString(o.ClientSecretEnv) {
			fail("auth.oidc.client_secret_env", "%q is not an environment variable name", o.ClientSecretEnv)
		}
	}
	grants := func(key string, gs []string) {
		for i, g := range gs {
			if _, err := permissions.ParseGrant(g); err != nil {
				fail(key+"["+itoa(i)+"]", "%v", err)
			}
		}
	}
	tiers := func(key string, ts []string) {
		for i, t := range ts {
			if t == "" {
				fail(key+"["+itoa(i)+"]", "empty tier name")
			}
		}
	}
	grants("policy.grants", c.Policy.Grants)
	for _, tag := range slices.Sorted(maps.Keys(c.Policy.SideEffects)) {
		key := "policy.side_effects." + strconv.Quote(tag)
		if _, err := risk.ParseSideEffect(tag); err != nil {
			names := make([]string, len(risk.SideEffects))
			for i, e := range risk.SideEffects {
				names[i] = string(e)
			}
			fail(key, "%v%s", err, didYouMean(tag, names))
		}
		if v := c.Policy.SideEffects[tag]; v != "" {
			if _, err := risk.ParseEffectPolicy(v); err != nil {
				fail(key, "%v%s", err, didYouMean(v, []string{"allow", "acknowledge", "deny"}))
			}
		} else {
			fail(key, "empty: want allow, acknowledge or deny")
		}
	}
	tiers("policy.acknowledge", c.Policy.Acknowledge)
	for _, sub := range slices.Sorted(maps.Keys(c.Policy.Subjects)) {
		s := c.Policy.Subjects[sub]
		grants("policy.subjects."+sub+".grants", s.Grants)
		tiers("policy.subjects."+sub+".acknowledge", s.Acknowledge)
	}
	if a := c.Auth.Anonymous; a != nil {
		if a.Sub == "" {
			fail("auth.anonymous.sub", "required: the subject anonymous callers act as")
		}
		if host, _, err := net.SplitHostPort(c.Server.Listen); err == nil && !isLoopback(host) {
			fail("auth.anonymous", "refused: server.listen %q is not a loopback address, and callers without a token may only come from this host", c.Server.Listen)
		}
		grants("auth.anonymous.grants", a.Grants)
		tiers("auth.anonymous.acknowledge", a.Acknowledge)
	}
	if n := c.Audit.MaxSize; n != nil && *n != 0 && *n < MinAuditMaxSize {
		fail("audit.max_size", "%d bytes is too small: want at least 1MiB (1048576), or 0 for no rotation", int64(*n))
	}
	if n := c.Audit.Reserve; n != 0 && n < MinAuditReserve {
		fail("audit.reserve", "%d bytes is too small: want at least 64KiB (65536)", int64(n))
	}
	if c.Audit.MaxFiles < 0 {
		fail("audit.max_files", "%d: want 1 or more rotated files to keep", c.Audit.MaxFiles)
	}
	if c.Policy.RateLimit.PerMinute < 0 || c.Policy.RateLimit.Burst < 0 {
		fail("policy.rate_limit", "per_minute and burst must not be negative")
	}
	for i, p := range c.Extensions.Paths {
		if p == "" {
			fail("extensions.paths["+itoa(i)+"]", "empty path")
		}
	}
	passEnv := func(key string, names []string) {
		for i, e := range names {
			switch {
			case !validEnvName(e):
				fail(key+"["+itoa(i)+"]", "%q is not an environment variable name", e)
			case c.ownSecret(e):
				fail(key+"["+itoa(i)+"]", "%s holds capgate's own key and is never passed to a subprocess", e)
			}
		}
	}
	size := func(key string, b ByteSize) {
		// Below a kilobyte no real result fits; above a gigabyte the bound
		// no longer protects the host's memory.
		if b < 1<<10 || b > 1<<30 {
			fail(key, "%d bytes is out of range: give between 1KiB and 1GiB, for example \"8MiB\"", int64(b))
		}
	}
	passEnv("extensions.env", c.Extensions.Env)
	size("server.max_request_bytes", c.Server.MaxRequestBytes)
	if c.Server.DrainDelay < 0 || c.Server.DrainDelay.Std() > 5*time.Minute {
		fail("server.drain_delay", "must be between 0s and 5m, for example \"5s\"")
	}
	if m := c.Server.MetricsListen; m != "" {
		if _, _, err := net.SplitHostPort(m); err != nil {
			fail("server.metrics_listen", "%q is not host:port, for example \"127.0.0.1:9464\"", m)
		}
	}
	if l := c.Console.Listen; l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			fail("console.listen", "%q is not host:port, for example \"127.0.0.1:8788\"", l)
		}
		if len(c.Console.Approvers)+len(c.Console.Viewers) == 0 {
			fail("console.approvers", "the console is on but nobody may use it: name subjects in approvers or viewers")
		}
		if c.Console.ClientID != "" && c.Auth.OIDC == nil {
			fail("console.client_id", "OpenID sign-in needs [auth.oidc] issuer")
		}
		if u := c.Console.URL; u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			fail("console.url", "%q is not an http(s) URL", u)
		}
	}
	if w := c.Policy.ApprovalWait.Std(); w < 0 || w > time.Hour {
		fail("policy.approval_wait", "must be between 0s and 1h, for example \"2m\"")
	}
	if l := c.Idempotency.Lease.Std(); l < 300*time.Millisecond || l > 5*time.Minute {
		fail("idempotency.lease", "must be between 300ms and 5m, for example \"6s\"")
	}
	if w := c.Idempotency.Wait.Std(); w < 0 || w > time.Minute {
		fail("idempotency.wait", "must be between 0s and 1m, for example \"5s\"")
	}
	for i, p := range c.Idempotency.Repeatable {
		if strings.TrimSpace(p) == "" {
			fail("idempotency.repeatable["+itoa(i)+"]", "empty pattern: give a tool id or a pattern of them, for example \"mcp:files:put_*\"")
		}
	}
	if c.Server.HeaderTimeout < 0 {
		fail("server.header_timeout", "must be positive, for example \"10s\"")
	}
	if c.Server.SessionIdleTimeout < 0 {
		fail("server.session_idle_timeout", "must be positive, for example \"30m\"")
	}
	if c.Server.MaxSessions < 0 {
		fail("server.max_sessions", "must be positive, for example 10000")
	}
	size("extensions.max_output_bytes", c.Extensions.MaxOutputBytes)
	size("capabilities.max_output_bytes", c.Capabilities.MaxOutputBytes)
	size("mcp.max_result_bytes", c.MCP.MaxResultBytes)
	for _, name := range slices.Sorted(maps.Keys(c.MCP.Servers)) {
		s := c.MCP.Servers[name]
		c.validateServer("mcp.servers."+name, name, s, fail)
	}
	c.validateGuarantees(fail)
	namespaces := map[string]string{}
	for _, p := range c.Providers() {
		if len(p.Command) == 0 || p.Command[0] == "" {
			fail(p.Key+".command", "required: the provider's argv, for example [\"gogcli\", \"bridge\"]")
		}
		if !namespaceRe.MatchString(p.Namespace) {
			fail(p.Key+".namespace", "%q must match ^[a-z0-9][a-z0-9_-]*$", p.Namespace)
		}
		if p.TimeoutSeconds < 0 {
			fail(p.Key+".timeout_seconds", "must be positive")
		}
		passEnv(p.Key+".env", p.Env)
		if other, ok := namespaces[p.Namespace]; ok && p.IsEnabled() {
			fail(p.Key+".namespace", "%q is also the namespace of %s", p.Namespace, other)
		}
		if p.IsEnabled() {
			namespaces[p.Namespace] = p.Key
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Skills)) {
		s := c.Skills[name]
		for k := range s.Env {
			if !upperEnv.MatchString(k) {
				fail("skills."+name+".env."+k, "environment names are UPPER_CASE")
			}
		}
		if name == "defaults" && (s.Enabled != nil || s.Model != "" || s.Env != nil || s.CapabilityProvider != nil) {
			fail("skills.defaults", "only allow_chat_ids may be set here")
		}
	}
}

func (c *Config) validateServer(key, name string, s *MCPServer, fail func(key, format string, args ...any)) {
	if !serverName.MatchString(name) {
		fail(key, "server name %q may hold only letters, digits, _ and -", name)
	}
	if s == nil {
		fail(key, "empty server")
		return
	}
	switch {
	case s.Command == "" && s.URL == "":
		fail(key+".command", "required (or url): how to reach the server")
	case s.Command != "" && s.URL != "":
		fail(key, "command and url are both set; a server is one or the other")
	case s.Command != "":
		if s.Transport != "" && s.Transport != "stdio" {
			fail(key+".transport", "%q does not go with command (stdio)", s.Transport)
		}
		if len(s.Headers) > 0 {
			fail(key+".headers", "headers go with url, not command")
		}
	default:
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fail(key+".url", "%q is not an http(s) URL", s.URL)
		}
		if s.Transport != "streamable-http" && s.Transport != "sse" {
			fail(key+".transport", "%q: valid transports are streamable-http and sse%s", s.Transport,
				didYouMean(s.Transport, []string{"streamable-http", "sse"}))
		}
		if len(s.Args) > 0 || len(s.Env) > 0 || s.Cwd != "" {
			fail(key, "args, env and cwd go with command, not url")
		}
		for _, h := range slices.Sorted(maps.Keys(s.Headers)) {
			// These carry each call's own method, name and arguments
			// (SEP-2243): one fixed value would stand in for them.
			if l := strings.ToLower(h); l == "mcp-method" || l == "mcp-name" || strings.HasPrefix(l, "mcp-param-") {
				fail(key+".headers", "%q is set by capgate from each request (Mcp-Method, Mcp-Name, Mcp-Param-*), not by configuration", h)
			}
		}
	}
	c.validateServerAuth(key, s, fail)
	if s.MaxResultBytes != c.MCP.MaxResultBytes && (s.MaxResultBytes < 1<<10 || s.MaxResultBytes > 1<<30) {
		fail(key+".max_result_bytes", "%d bytes is out of range: give between 1KiB and 1GiB, for example \"8MiB\"", int64(s.MaxResultBytes))
	}
	if s.Prefix != nil && !prefixChars.MatchString(*s.Prefix) {
		fail(key+".prefix", "%q may hold only letters, digits, _ and -", *s.Prefix)
	}
	checkRisk(key, s.Risk, s.SideEffects, fail)
	for _, t := range slices.Sorted(maps.Keys(s.Tools)) {
		o := s.Tools[t]
		tk := key + ".tools." + t
		checkRisk(tk, o.Risk, o.SideEffects, fail)
		if o.Name != "" && !tool.ValidExposedName(o.Name) {
			fail(tk+".name", "%q must match ^[a-zA-Z0-9_-]{1,64}$", o.Name)
		}
	}
}

// validateServerAuth checks a server's auth keys (issue 27).
func (c *Config) validateServerAuth(key string, s *MCPServer, fail func(key, format string, args ...any)) {
	switch s.Auth {
	case "", "none":
		if s.ClientID != "" || s.ClientSecretEnv != "" || len(s.Scopes) > 0 || s.TokenHeader != "" {
			fail(key+".auth", "client_id, client_secret_env, scopes and token_header go with auth = \"oauth\", \"token-exchange\" or \"user-token\"")
		}
		return
	case "oauth", "user-token":
		if c.Server.PublicURL == "" {
			fail(key+".auth", "auth = %q needs server.public_url: where users' browsers reach capgate to sign in", s.Auth)
		}
	case "token-exchange":
		if c.Auth.OIDC == nil {
			fail(key+".auth", "auth = \"token-exchange\" needs [auth.oidc]: the issuer whose tokens are exchanged")
		}
		if s.ClientID == "" {
			fail(key+".client_id", "auth = \"token-exchange\" needs client_id: capgate's client at the [auth.oidc] issuer, which exchanges")
		}
	default:
		fail(key+".auth", "%q: valid values are none, oauth, token-exchange and user-token", s.Auth)
		return
	}
	if s.URL == "" || s.Transport == "sse" {
		fail(key+".auth", "auth = %q needs a streamable-http url: each caller's requests carry their own credential", s.Auth)
	}
	for h := range s.Headers {
		if strings.EqualFold(h, "Authorization") {
			fail(key+".headers", "an Authorization header and auth = %q are both set: one credential for everyone or each user's own, not both", s.Auth)
		}
	}
	if s.ClientSecretEnv != "" && !upperEnv.MatchString(s.ClientSecretEnv) {
		fail(key+".client_secret_env", "%q is not an environment variable name", s.ClientSecretEnv)
	}
	if s.ClientSecretEnv != "" && s.ClientID == "" {
		fail(key+".client_secret_env", "a client secret goes with client_id")
	}
	if s.TokenHeader != "" && s.Auth != "user-token" {
		fail(key+".token_header", "goes with auth = \"user-token\"")
	}
}

func checkRisk(key, level string, effects []string, fail func(key, format string, args ...any)) {
	if level != "" {
		if _, err := risk.ParseLevel(level); err != nil {
			fail(key+".risk", "%v", err)
		}
	}
	for i, e := range effects {
		if _, err := risk.ParseSideEffect(e); err != nil {
			fail(key+".side_effects["+itoa(i)+"]", "%v", err)
		}
	}
}

// ownSecret reports a variable that holds one of capgate's own keys: the
// token key, the vault key, or a key in Ash's name, which a bridge
// provider gets from capgate itself.
func (c *Config) ownSecret(name string) bool {
	return name == c.Auth.SecretEnv || name == DefaultSecretEnv || name == "CAPGATE_STORE_KEY" || name == "ASH_CONTEXT_TOKEN_SECRET"
}
