// Package config reads capgate's host configuration, capgate.toml: a strict
// decode (unknown keys are errors, but for Ash's UPPER_CASE env keys in
// [skills.NAME]; see skills.go), ${ENV} expansion in strings, paths
// relative to the file, defaults, then validation. Every error names the
// file, the key and the problem.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/capgate/capgate/internal/suggest"
)

// Config is capgate.toml.
type Config struct {
	// Path is the file the config came from; Dir is its directory, against
	// which relative paths were resolved.
	Path string `toml:"-"`
	Dir  string `toml:"-"`

	Server       Server           `toml:"server"`
	Auth         Auth             `toml:"auth"`
	Policy       Policy           `toml:"policy"`
	Audit        Audit            `toml:"audit"`
	Extensions   Extensions       `toml:"extensions"`
	MCP          MCP              `toml:"mcp"`
	Capabilities Capabilities     `toml:"capabilities"`
	Skills       map[string]Skill `toml:"skills"`
	// CapabilityOverrides are the operator's guarantees per tool id (or
	// "kind:source" for a stdio MCP server's or bridge provider's whole
	// process): they only tighten (sandbox.ParseOverrides).
	CapabilityOverrides map[string]map[string]any `toml:"capability_overrides"`
	Trust               Trust                     `toml:"trust"`
	Sandbox             Sandbox                   `toml:"sandbox"`
	Store               Store                     `toml:"store"`
	Console             Console                   `toml:"console"`
	Idempotency         Idempotency               `toml:"idempotency"`
	Discovery           Discovery                 `toml:"discovery"`
	// SkillDirs are Ash's [skills] dirs: directories of installed skills,
	// read apart from the skill tables (see takeSkillDirs).
	SkillDirs []string `toml:"-"`
	// Notes say what loading decided that the file does not spell out
	// (Ash's default wiring of a bundled skill); config check prints them.
	Notes []string `toml:"-"`
}

type Server struct {
	Listen  string `toml:"listen"`   // default 127.0.0.1:8787
	DataDir string `toml:"data_dir"` // default ~/.local/share/capgate
	// Socket is the Unix socket the capability RPC also listens on; default
	// <data_dir>/rpc.sock, "-" for none.
	Socket string `toml:"socket"`
	// HeaderTimeout is how long a client has to send a request's headers,
	// counted from its first byte: a client trickling bytes is cut then.
	HeaderTimeout Duration `toml:"header_timeout"` // default 10s
	// MaxRequestBytes bounds one request body on /mcp and /rpc; a larger
	// one is answered 413 before it is read.
	MaxRequestBytes ByteSize `toml:"max_request_bytes"` // default 8 MiB
	// DrainDelay is how long, after SIGTERM, /readyz answers 503 while
	// capgate still serves, so that a balancer stops sending it calls
	// before it closes its listeners. Default 0: stop at once.
	DrainDelay Duration `toml:"drain_delay"`
	// SessionIdleTimeout: an MCP session (protocol 2025-11-25) that sent
	// nothing for this long is forgotten, its state freed; a client that
	// comes back with its id gets a fresh session. Default 30m.
	SessionIdleTimeout Duration `toml:"session_idle_timeout"`
	// MaxSessions caps the MCP sessions held at once: past it, opening one
	// forgets the session idle longest. Default 4096 (each holds about
	// 10 KiB: server.BenchmarkSessionMemory).
	MaxSessions int `toml:"max_sessions"`
	// ReplicaID names this replica in its audit records and in the
	// request states of the calls it holds. Default: <hostname>-<pid>.
	ReplicaID string `toml:"replica_id"`
	// AdvertiseURL is where the other replicas reach this one (its
	// listener, e.g. http://10.0.0.5:8787), to forward the continuation
	// of a call parked here. "": continuations go to the replica the
	// client reaches.
	AdvertiseURL string `toml:"advertise_url"`
	// MetricsListen is where GET /metrics (Prometheus text) is served,
	// without a token, on a listener of its own; "" (the default) serves
	// no metrics and collects none. Keep it on loopback or a private
	// network: it names every exposed tool.
	MetricsListen string `toml:"metrics_listen"`
	// WatchConfig reloads the config when it, its risk file or
	// capgate.lock changes, as SIGHUP does.
	WatchConfig bool `toml:"watch_config"`
	// PublicURL is where users' browsers reach capgate (https in
	// production): the sign-in links of [mcp.servers] with auth = "oauth"
	// or "user-token" are under it, and the OAuth redirect URI is
	// <public_url>/oauth/callback.
	PublicURL string `toml:"public_url"`
}

type Auth struct {
	SecretEnv string `toml:"secret_env"` // default CAPGATE_TOKEN_SECRET
	Audience  string `toml:"audience"`   // default capgate
	JWKSFile  string `toml:"jwks_file"`
	// JWKSURL is a JWKS fetched over HTTP(S) and refreshed (hourly, and on
	// an unknown kid at most once a minute).
	JWKSURL string `toml:"jwks_url"`
	// OIDC takes the keys from an OpenID provider's discovery document and
	// requires its tokens to name it as iss and capgate as aud.
	OIDC *OIDC `toml:"oidc"`
	// AllowHS256 says whether HS256 tokens (the shared secret, or the
	// development key capgate makes) are accepted. Unset: yes without a
	// JWKS, no with one; a JWKS deployment takes both only when asked.
	AllowHS256 *bool      `toml:"allow_hs256"`
	Anonymous  *Anonymous `toml:"anonymous"`
}

// HS256 reports whether HS256 tokens are accepted (see AllowHS256).
func (a *Auth) HS256() bool {
	if a.AllowHS256 != nil {
		return *a.AllowHS256
	}
	return a.JWKSFile == "" && a.JWKSURL == "" && a.OIDC == nil
}

// HS256OffBy names the key that turned HS256 off ("" when it is on): for
// messages that tell the operator why there is no shared key.
func (a *Auth) HS256OffBy() string {
	switch {
	case a.HS256():
		return ""
	case a.AllowHS256 != nil:
		return "auth.allow_hs256 = false"
	case a.OIDC != nil:
		return "auth.oidc"
	case a.JWKSURL != "":
		return "auth.jwks_url"
	}
	return "auth.jwks_file"
}

// OIDC is an OpenID Connect issuer whose tokens capgate accepts.
type OIDC struct {
	Issuer   string `toml:"issuer"`   // the exact iss; its discovery document is at Issuer/.well-known/openid-configuration
	Audience string `toml:"audience"` // the aud its tokens must carry; default auth.audience
	// ClientID is capgate's client at this provider for browsers: with it,
	// a page that links an account on an upstream (auth = "oauth" or
	// "user-token") first signs the browser in here, and goes on only for
	// the subject the link is for. Register <server.public_url>/oauth/signin
	// as its redirect URI. Without it, whoever opens a link can complete it.
	ClientID string `toml:"client_id"`
	// ClientSecretEnv names the environment variable holding that client's
	// secret, if the provider gave it one.
	ClientSecretEnv string `toml:"client_secret_env"`
}

// Anonymous lets callers without a token in, as one narrow subject.
type Anonymous struct {
	Sub         string   `toml:"sub"`
	Grants      []string `toml:"grants"`
	Acknowledge []string `toml:"acknowledge"`
}

type Policy struct {
	Grants      []string           `toml:"grants"`      // every verified caller
	Acknowledge []string           `toml:"acknowledge"` // tiers acknowledged for every caller
	RiskFile    string             `toml:"risk_file"`   // replaces the built-in capability_risk.yaml
	RequireLock bool               `toml:"require_lock"`
	Subjects    map[string]Subject `toml:"subjects"`
	RateLimit   RateLimit          `toml:"rate_limit"`
	// ApprovalWait holds a call that needs an operator's approval for up
	// to this long, sending its client progress notifications ("waiting
	// for approval apr_…"), and goes on when approved or fails when denied
	// or timed out. 0 (the default): the call fails at once with
	// approval_required, and the caller repeats it once approved.
	ApprovalWait Duration `toml:"approval_wait"`
	// SideEffects is a policy per side-effect tag, for every caller and
	// tool: "fs.delete" = "acknowledge" (the caller must acknowledge the
	// tag, as a tier: the token's ack claim, [policy] acknowledge) or
	// "deny" (refused, whoever calls); "allow" is the default. A tool's
	// side effects are what it declares, the operator sets or capgate
	// infers (capgate tools show).
	SideEffects map[string]string `toml:"side_effects"`
}

// RateLimit is a token bucket per caller and tool; zero per_minute is off.
type RateLimit struct {
	PerMinute float64 `toml:"per_minute"`
	Burst     int     `toml:"burst"` // default: ten seconds' worth, at least 1
}

type Subject struct {
	Grants      []string `toml:"grants"`
	Acknowledge []string `toml:"acknowledge"`
}

// Console is the operator console, in a browser: the approvals queue, the
// audit, the catalog, accounts and live state. It is off unless Listen is
// set, and is served on a listener of its own with the same Host check as
// the main one.
type Console struct {
	// Listen is where the console is served, for example "127.0.0.1:8788".
	Listen string `toml:"listen"`
	// URL is where operators' browsers reach the console (sign-in links,
	// the OpenID redirect <url>/oidc/callback); default http://<listen>.
	// An https URL marks its cookies Secure.
	URL string `toml:"url"`
	// Approvers may approve and deny calls and revoke accounts; Viewers
	// read everything but the inputs of tools marked sensitive. Each is a
	// subject, or "claim=value" matched against the OpenID provider's ID
	// token (a list claim matches when it holds the value). Everyone else
	// is refused.
	Approvers []string `toml:"approvers"`
	Viewers   []string `toml:"viewers"`
	// ClientID is the console's client at the [auth.oidc] provider, for
	// sign-in with it (authorization code with PKCE); without it, only
	// `capgate console login` links sign in.
	ClientID string `toml:"client_id"`
	// ClientSecretEnv names the environment variable holding the client's
	// secret, if the provider gave it one.
	ClientSecretEnv string `toml:"client_secret_env"`
}

// Store is where shared state lives. Without a URL it is SQLite under
// server.data_dir; with one, PostgreSQL that replicas share (the vault key
// then comes only from CAPGATE_STORE_KEY).
type Store struct {
	URL string `toml:"url"` // postgres://user:pass@host/db; ${ENV} expands
}

// Idempotency is how a call with an idempotency key runs once, across
// replicas too (docs/replicas.md).
type Idempotency struct {
	// Lease: a key's claim holds this long unless the replica running its
	// call renews it, every third of it; a claim not renewed for this long
	// belongs to a replica that died.
	Lease Duration `toml:"lease"` // default 6s
	// Wait: how long a retry waits for the call in progress under its key
	// before answering rate_limited with retry_after_seconds.
	Wait Duration `toml:"wait"` // default 5s
	// Repeatable are tool-id patterns (fnmatch, as grants) of tools safe to
	// run twice with the same input: a retry of a key whose first call's
	// replica died runs them again. Any other tool's retry is told that
	// the first call's outcome is unknown.
	Repeatable []string `toml:"repeatable"`
}

type Audit struct {
	Path string `toml:"path"` // default <data_dir>/audit.jsonl
	// MaxSize: past this size the log file is moved aside and the chain
	// continues in a new one; default 64 MiB, "0" never (the disk may fill).
	MaxSize *ByteSize `toml:"max_size"`
	// MaxFiles is how many moved-aside files are kept; default 10.
	MaxFiles int `toml:"max_files"`
	// Reserve is the disk space kept allocated ahead of the log's end:
	// a call runs only once its records' space is in it. Default 4 MiB,
	// at least 64 KiB.
	Reserve ByteSize `toml:"reserve"`
}

type Extensions struct {
	Paths []string `toml:"paths"` // each holds one directory per pack
	// Env names host variables passed through to pack commands, beyond the
	// small allow list.
	Env            []string `toml:"env"`
	Timeout        Duration `toml:"timeout"`          // default 30s
	MaxOutputBytes ByteSize `toml:"max_output_bytes"` // default 1 MiB
}

type MCP struct {
	// MaxResultBytes bounds each message an upstream sends (a tools/call
	// result above all); default 8 MiB. A server's own key overrides it.
	MaxResultBytes ByteSize              `toml:"max_result_bytes"`
	Servers        map[string]*MCPServer `toml:"servers"`
}

// MCPServer is one upstream: a stdio command, or a URL.
type MCPServer struct {
	Command string            `toml:"command"`
	Args    []string          `toml:"args"`
	Env     map[string]string `toml:"env"`
	Cwd     string            `toml:"cwd"`

	URL       string            `toml:"url"`
	Transport string            `toml:"transport"` // streamable-http (default) or sse
	Headers   map[string]string `toml:"headers"`

	// Auth is how each caller's requests are authorized upstream: "none"
	// (the default: Headers only, the same for everyone), "oauth" (each
	// user signs in to the server's authorization server; needs
	// server.public_url), "token-exchange" (the caller's [auth.oidc] token
	// is exchanged at its issuer, RFC 8693) or "user-token" (each user
	// enters their own token on a form under server.public_url).
	Auth string `toml:"auth"`
	// ClientID is a client pre-registered at the authorization server;
	// without it capgate uses a Client ID Metadata Document, else dynamic
	// registration.
	ClientID string `toml:"client_id"`
	// ClientSecretEnv names the variable holding ClientID's secret.
	ClientSecretEnv string `toml:"client_secret_env"`
	// Scopes to ask for; default what the server's metadata says.
	Scopes []string `toml:"scopes"`
	// TokenHeader is the header a user token is sent in (auth =
	// "user-token"); default Authorization, as "Bearer <token>".
	TokenHeader string `toml:"token_header"`

	// Prefix of exposed names; nil means the server's name, "" none.
	Prefix  *string  `toml:"prefix"`
	Timeout Duration `toml:"timeout"` // default 60s
	// MaxResultBytes overrides mcp.max_result_bytes for this server.
	MaxResultBytes ByteSize `toml:"max_result_bytes"`

	// Defaults for the server's tools.
	Risk        string   `toml:"risk"`
	SideEffects []string `toml:"side_effects"`
	// TrustAnnotations lets the server's tool annotations lower the risk
	// inferred from words (readOnlyHint → LOW). Off, they may only raise it.
	TrustAnnotations bool `toml:"trust_annotations"`

	Tools map[string]ToolOverride `toml:"tools"`

	// Capabilities declares what a stdio server's process needs
	// (sandbox.ParseDeclared: filesystem, network, env, subprocess,
	// secrets, read_paths, write_paths); what it leaves out, it is denied.
	// Its cwd is readable whatever it declares.
	Capabilities map[string]any `toml:"capabilities"`
}

// Trust is [trust]: the ceiling of every tool's guarantees.
type Trust struct {
	// AllowedCapabilities has the shape of a declaration: network =
	// "none" here makes every tool no_network.
	AllowedCapabilities map[string]any `toml:"allowed_capabilities"`
}

// Sandbox is [sandbox]: how every process capgate starts is run.
type Sandbox struct {
	// RunAs is the user every tool, bridge provider and stdio MCP server
	// runs as when capgate runs as root: a name, a uid or uid:gid. Unset,
	// it is "nobody" (65534:65534 where no user database names it).
	// "root" (or 0) keeps them root, without any capability: an opt-out
	// that serve logs and verify --prod reports. Ignored when capgate is
	// not root: its tools run as capgate's own user.
	RunAs string `toml:"run_as"`
	// AuditFileDenials lets a root capgate turn kernel audit on when it is
	// off, so that a call whose tool Landlock refused a file names the
	// access, the path and the declaration that would allow it (Landlock
	// ABI 7 logs denials to audit). With audit already on, a root capgate
	// reads the records without it. With no audit daemon running, the
	// kernel also prints them in its log. Read at start.
	AuditFileDenials bool `toml:"audit_file_denials"`
}

// ToolOverride is an operator's word on one tool; it always wins.
type ToolOverride struct {
	Risk        string   `toml:"risk"`
	SideEffects []string `toml:"side_effects"`
	Description string   `toml:"description"`
	Hidden      bool     `toml:"hidden"`
	Name        string   `toml:"name"` // exposed name
}

type Capabilities struct {
	// MaxOutputBytes bounds what a bridge provider writes for one call;
	// default 4 MiB.
	MaxOutputBytes ByteSize             `toml:"max_output_bytes"`
	Providers      map[string]*Provider `toml:"providers"`
}

// Provider is a bridge-v1 command provider, in Ash's shape.
type Provider struct {
	Enabled        *bool    `toml:"enabled"` // default true
	Namespace      string   `toml:"namespace"`
	Command        []string `toml:"command"`
	TimeoutSeconds int      `toml:"timeout_seconds"` // default 30
	// Env names host variables passed through to the provider, beyond
	// the small allow list every subprocess gets.
	Env []string `toml:"env"`
	// Capabilities declares what the provider's process needs
	// (sandbox.ParseDeclared: filesystem, network, env, subprocess,
	// secrets, read_paths, write_paths); what it leaves out, it is denied.
	Capabilities map[string]any `toml:"capabilities"`
}

// IsEnabled reports whether the provider is on.
func (p *Provider) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// Skill is [skills.NAME]; [skills.defaults] holds allow_chat_ids for all.
type Skill struct {
	Enabled            *bool             `toml:"enabled"`
	Model              string            `toml:"model"`
	AllowChatIDs       []string          `toml:"allow_chat_ids"`
	Env                map[string]string `toml:"env"`
	CapabilityProvider *Provider         `toml:"capability_provider"`
}

// Duration is a TOML string such as "30s" or "2m".
type Duration time.Duration

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration such as \"30s\" or \"2m\"", b)
	}
	if v < 0 {
		return fmt.Errorf("%q is negative", b)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Std returns the duration as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Defaults.
const (
	DefaultListen          = "127.0.0.1:8787"
	DefaultDataDir         = "~/.local/share/capgate"
	DefaultHeaderTimeout   = 10 * time.Second
	DefaultSessionIdle     = 30 * time.Minute
	DefaultMaxSessions     = 4096
	DefaultIdemLease       = 6 * time.Second
	DefaultIdemWait        = 5 * time.Second
	DefaultMaxRequestBytes = 8 << 20
	DefaultSecretEnv       = "CAPGATE_TOKEN_SECRET"
	DefaultAudience        = "capgate"
	DefaultExtTimeout      = 30 * time.Second
	DefaultMaxOutputBytes  = 1 << 20 // extensions
	DefaultMCPResultBytes  = 8 << 20
	DefaultBridgeOutput    = 4 << 20
	DefaultMCPTimeout      = 60 * time.Second
	DefaultProviderTimeout = 30
	DefaultAuditMaxSize    = 64 << 20
	DefaultAuditMaxFiles   = 10
	// MinAuditMaxSize: a group commit writes up to about 256 KiB at once,
	// so smaller files would each hold about one group.
	MinAuditMaxSize = 1 << 20
	// MinAuditReserve: room for a few calls' records at their largest.
	MinAuditReserve = 64 << 10
)

// Options are the seams of loading.
type Options struct {
	// LookupEnv reads the environment for ${NAME}; default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Home replaces ~ in paths; default os.UserHomeDir.
	Home string
}

// Load reads and checks the config file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, filepath.Dir(abs), Options{})
}

// Parse reads a config whose relative paths are relative to dir. name is
// the file name used in messages.
func Parse(name string, data []byte, dir string, opts Options) (*Config, error) {
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Home == "" {
		opts.Home, _ = os.UserHomeDir()
	}
	c := &Config{Path: name, Dir: dir}
	dirs, data, err := takeSkillDirs(name, data)
	if err != nil {
		return nil, err
	}
	c.SkillDirs = dirs
	// Every problem in one run: a value of the wrong type is reported and
	// decoding goes on without it; then the unknown keys, then what the
	// values mean. Only a syntax error stops it.
	errs, data, err := decodeAll(name, data, c)
	if err != nil {
		if err := c.skillEnvKeys(name, data, err); err != nil {
			errs = append(errs, err)
		}
		var de *toml.DecodeError
		if errors.As(err, &de) && len(errs) > 0 && !isStrict(err) {
			return nil, errors.Join(errs...) // a syntax error: nothing more can be read
		}
	}
	c.applyAshProviders()
	c.mergeSkillProviders()
	fail := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", name, key, fmt.Sprintf(format, args...)))
	}
	expandEnv(c, opts.LookupEnv, fail)
	c.applyDefaults()
	c.resolvePaths(opts.Home)
	c.validate(fail)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// decodeError turns go-toml's errors into "file:line: key: problem" lines.
func decodeError(name string, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var errs []error
		for _, e := range strict.Errors {
			row, _ := e.Position()
			errs = append(errs, unknownKey(name, row, e.Key()))
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if m := typeMismatch.FindStringSubmatch(msg); m != nil {
			msg = "is a TOML " + m[1] + "; want " + tomlType(m[2])
		}
		if key := de.Key(); len(key) > 0 {
			return fmt.Errorf("%s:%d: %s: %s", name, row, strings.Join(key, "."), msg)
		}
		return fmt.Errorf("%s:%d: %s", name, row, msg)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// isStrict reports unknown keys, the one decode error after which the
// rest of the config was read.
func isStrict(err error) bool {
	var strict *toml.StrictMissingError
	return errors.As(err, &strict)
}

// unknownKey is the problem of a key the config does not have, with the
// nearest one it does where that is a likely typo.
func unknownKey(name string, row int, key []string) error {
	msg := fmt.Sprintf("%s:%d: %s: unknown key", name, row, strings.Join(key, "."))
	if len(key) > 0 {
		known := knownKeys(key[:len(key)-1])
		if s := suggest.Nearest(key[len(key)-1], known); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", s)
		}
	}
	return errors.New(msg)
}

var typeMismatch = regexp.MustCompile(`^cannot decode TOML (\w+) into (?:struct field )?\S+ of type (\S+)$`)

// tomlType names a Go field type the way a TOML author thinks of it.
func tomlType(goType string) string {
	switch goType {
	case "string", "config.Duration":
		return "a string"
	case "[]string":
		return "a list of strings"
	case "bool", "*bool":
		return "true or false"
	case "int", "int64":
		return "an integer"
	case "config.ByteSize", "*config.ByteSize":
		return "a size such as \"8MiB\" or a number of bytes"
	case "map[string]string":
		return "a table of strings"
	}
	if strings.HasPrefix(goType, "map[") || strings.HasPrefix(goType, "config.") || strings.HasPrefix(goType, "*config.") {
		return "a table"
	}
	return goType
}

func (c *Config) applyDefaults() {
	c.Discovery.applyDefaults()
	if c.Server.Listen == "" {
		c.Server.Listen = DefaultListen
	}
	if c.Server.DataDir == "" {
		c.Server.DataDir = DefaultDataDir
	}
	if c.Server.HeaderTimeout == 0 {
		c.Server.HeaderTimeout = Duration(DefaultHeaderTimeout)
	}
	if c.Server.SessionIdleTimeout == 0 {
		c.Server.SessionIdleTimeout = Duration(DefaultSessionIdle)
	}
	if c.Server.MaxSessions == 0 {
		c.Server.MaxSessions = DefaultMaxSessions
	}
	if c.Server.MaxRequestBytes == 0 {
		c.Server.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.Idempotency.Lease == 0 {
		c.Idempotency.Lease = Duration(DefaultIdemLease)
	}
	if c.Idempotency.Wait == 0 {
		c.Idempotency.Wait = Duration(DefaultIdemWait)
	}
	if c.Auth.SecretEnv == "" {
		c.Auth.SecretEnv = DefaultSecretEnv
	}
	if c.Auth.Audience == "" {
		c.Auth.Audience = DefaultAudience
	}
	if c.Auth.OIDC != nil && c.Auth.OIDC.Audience == "" {
		c.Auth.OIDC.Audience = c.Auth.Audience
	}
	if c.Extensions.Timeout == 0 {
		c.Extensions.Timeout = Duration(DefaultExtTimeout)
	}
	if c.Extensions.MaxOutputBytes == 0 {
		c.Extensions.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.Capabilities.MaxOutputBytes == 0 {
		c.Capabilities.MaxOutputBytes = DefaultBridgeOutput
	}
	if c.MCP.MaxResultBytes == 0 {
		c.MCP.MaxResultBytes = DefaultMCPResultBytes
	}
	if c.Audit.MaxSize == nil {
		d := ByteSize(DefaultAuditMaxSize)
		c.Audit.MaxSize = &d
	}
	if c.Audit.MaxFiles == 0 {
		c.Audit.MaxFiles = DefaultAuditMaxFiles
	}
	for name, s := range c.MCP.Servers {
		if s == nil {
			continue
		}
		if s.Timeout == 0 {
			s.Timeout = Duration(DefaultMCPTimeout)
		}
		if s.MaxResultBytes == 0 {
			s.MaxResultBytes = c.MCP.MaxResultBytes
		}
		if s.URL != "" && s.Transport == "" {
			s.Transport = "streamable-http"
		}
		if s.Prefix == nil {
			p := name
			s.Prefix = &p
		}
	}
	for _, p := range c.Providers() {
		p.applyDefaults()
	}
}

func (p *Provider) applyDefaults() {
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = DefaultProviderTimeout
	}
}

// NamedProvider is a provider with where it was configured.
type NamedProvider struct {
	*Provider
	Key string // the config key, for messages
}

// Providers lists every bridge provider, from [capabilities.providers.NS]
// and [skills.NAME.capability_provider], with its namespace defaulted. A
// disabled skill's provider is not listed: it is neither checked nor wired.
func (c *Config) Providers() []NamedProvider {
	var out []NamedProvider
	for ns, p := range c.Capabilities.Providers {
		if p == nil {
			continue
		}
		if p.Namespace == "" {
			p.Namespace = ns
		}
		out = append(out, NamedProvider{p, "capabilities.providers." + ns})
	}
	for name, s := range c.Skills {
		if s.CapabilityProvider == nil || skillDisabled(s) {
			continue
		}
		if s.CapabilityProvider.Namespace == "" {
			s.CapabilityProvider.Namespace = name
		}
		out = append(out, NamedProvider{s.CapabilityProvider, "skills." + name + ".capability_provider"})
	}
	sortProviders(out)
	return out
}

// resolvePaths makes relative paths relative to the config's directory and
// expands a leading ~.
func (c *Config) resolvePaths(home string) {
	abs := func(p string) string {
		if p == "" {
			return p
		}
		if p == "~" || strings.HasPrefix(p, "~/") {
			return filepath.Join(home, p[1:])
		}
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(c.Dir, p)
	}
	for i, d := range c.SkillDirs {
		c.SkillDirs[i] = abs(d)
	}
	// A command is a path only when it names one; a bare name is looked up
	// in PATH.
	cmd := func(p string) string {
		if strings.ContainsRune(p, '/') {
			return abs(p)
		}
		return p
	}
	c.Server.DataDir = abs(c.Server.DataDir)
	c.Auth.JWKSFile = abs(c.Auth.JWKSFile)
	c.Policy.RiskFile = abs(c.Policy.RiskFile)
	c.Audit.Path = abs(c.Audit.Path)
	if c.Server.Socket != "-" {
		c.Server.Socket = abs(c.Server.Socket)
	}
	for i, p := range c.Extensions.Paths {
		c.Extensions.Paths[i] = abs(p)
	}
	for _, s := range c.MCP.Servers {
		if s == nil {
			continue
		}
		s.Cwd = abs(s.Cwd)
		s.Command = cmd(s.Command)
	}
	for _, p := range c.Providers() {
		if len(p.Command) > 0 {
			p.Command[0] = cmd(p.Command[0])
		}
	}
	if c.Server.Socket == "" {
		c.Server.Socket = filepath.Join(c.Server.DataDir, "rpc.sock")
	}
	if c.Audit.Path == "" {
		c.Audit.Path = filepath.Join(c.Server.DataDir, "audit.jsonl")
	}
}
