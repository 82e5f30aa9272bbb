package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func parse(t *testing.T, src string, vars map[string]string) (*Config, error) {
	t.Helper()
	return Parse("capgate.toml", []byte(src), "/etc/capgate", Options{LookupEnv: env(vars), Home: "/home/u"})
}

func TestLoadExample(t *testing.T) {
	t.Setenv("FIXTURE_TOKEN", "tok-123")
	t.Setenv("REMOTE_TOKEN", "rt-9")
	c, err := Load("testdata/capgate.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs("testdata")
	if c.Dir != dir || c.Server.DataDir != filepath.Join(dir, "data") {
		t.Errorf("dir %q data_dir %q", c.Dir, c.Server.DataDir)
	}
	if c.Audit.Path != filepath.Join(dir, "data", "audit.jsonl") {
		t.Errorf("audit path %q, want under data_dir", c.Audit.Path)
	}
	if c.Extensions.Paths[0] != filepath.Join(dir, "extensions") {
		t.Errorf("extension path %q", c.Extensions.Paths[0])
	}
	ev := c.MCP.Servers["everything"]
	if ev.Command != "npx" || *ev.Prefix != "everything" || ev.Timeout.Std() != DefaultMCPTimeout || ev.Tools["echo"].Name != "say" {
		t.Errorf("everything: %+v", ev)
	}
	local := c.MCP.Servers["local"]
	if local.Command != filepath.Join(dir, "bin/fixture") || *local.Prefix != "" || local.Timeout.Std() != 5*time.Second {
		t.Errorf("local: command %q prefix %q timeout %v", local.Command, *local.Prefix, local.Timeout)
	}
	if local.Env["TOKEN"] != "tok-123" || local.Env["MODE"] != "fast" {
		t.Errorf("env expansion: %v", local.Env)
	}
	remote := c.MCP.Servers["remote"]
	if remote.Transport != "streamable-http" || remote.Headers["Authorization"] != "Bearer rt-9" {
		t.Errorf("remote: %+v", remote)
	}
	ps := c.Providers()
	if len(ps) != 2 || ps[0].Key != "capabilities.providers.gog" || ps[0].TimeoutSeconds != 30 || !ps[0].IsEnabled() {
		t.Fatalf("providers %+v", ps)
	}
	if ps[1].Namespace != "mail" || ps[1].Command[0] != filepath.Join(dir, "bin/mailbridge") || ps[1].TimeoutSeconds != DefaultProviderTimeout {
		t.Errorf("skill provider %+v", ps[1])
	}
	if c.Policy.Subjects["alice"].Acknowledge[0] != "elevated" || c.Skills["defaults"].AllowChatIDs[0] != "42" {
		t.Errorf("policy or skills: %+v %+v", c.Policy, c.Skills)
	}
}

func TestDefaults(t *testing.T) {
	c, err := parse(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Listen != DefaultListen || c.Server.DataDir != "/home/u/.local/share/capgate" ||
		c.Auth.SecretEnv != DefaultSecretEnv || c.Auth.Audience != "capgate" ||
		c.Extensions.Timeout.Std() != DefaultExtTimeout || c.Extensions.MaxOutputBytes != DefaultMaxOutputBytes {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.Policy.Grants) != 0 {
		t.Errorf("default grants %v, want none (fail closed)", c.Policy.Grants)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		src  string
		vars map[string]string
		want []string
	}{
		{"[server]\nlisten = \"x\"\nlisen = \"y\"\n", nil, []string{"capgate.toml:3: server.lisen: unknown key"}},
		{"[mcp.servers.a]\ncommand = \"x\"\ncomand = \"y\"\n[policy]\ngrant = []\n", nil,
			[]string{"capgate.toml:3: mcp.servers.a.comand: unknown key", "capgate.toml:5: policy.grant: unknown key"}},
		{"[server\n", nil, []string{"capgate.toml:1:"}},
		{"[mcp.servers.a]\ncommand = \"x\"\ntimeout = \"soon\"\n", nil, []string{"capgate.toml:3:", `"soon" is not a duration`}},
		{"[capabilities.providers.gog]\ncommand = \"gogcli bridge\"\n", nil, []string{"capgate.toml:2: capabilities.providers.gog.command: is a TOML string; want a list of strings"}},
		{"[policy]\nrequire_lock = \"yes\"\n", nil, []string{"capgate.toml:2: policy.require_lock: is a TOML string; want true or false"}},
		{"[server]\nlisten = \"nope\"\n", nil, []string{`capgate.toml: server.listen: "nope" is not host:port`}},
		{"[server]\nadvertise_url = \"10.0.0.5:8787\"\n", nil, []string{`capgate.toml: server.advertise_url: "10.0.0.5:8787" is not an absolute http or https URL`}},
		{"[server]\nmetrics_listen = \"9464\"\n", nil, []string{`server.metrics_listen: "9464" is not host:port`}},
		{"[mcp.servers.a]\nargs = []\n", nil, []string{"capgate.toml: mcp.servers.a.command: required (or url)"}},
		{"[mcp.servers.a]\ncommand = \"x\"\nurl = \"http://h/\"\n", nil, []string{"command and url are both set"}},
		{"[mcp.servers.a]\nurl = \"ftp://h/\"\n", nil, []string{`mcp.servers.a.url: "ftp://h/" is not an http(s) URL`}},
		{"[mcp.servers.a]\nurl = \"http://h/\"\ntransport = \"ws\"\n", nil, []string{`mcp.servers.a.transport: "ws": valid transports are streamable-http and sse`}},
		{"[mcp.servers.a]\ncommand = \"x\"\nheaders = {A = \"b\"}\n", nil, []string{"mcp.servers.a.headers: headers go with url"}},
		{"[mcp.servers.a]\nurl = \"http://h/\"\nheaders = {mcp-param-region = \"eu\", Mcp-Name = \"x\"}\n", nil,
			[]string{`mcp.servers.a.headers: "Mcp-Name" is set by capgate from each request`, `mcp.servers.a.headers: "mcp-param-region" is set by capgate`}},
		{"[mcp.servers.\"a.b\"]\ncommand = \"x\"\n", nil, []string{`server name "a.b" may hold only`}},
		{"[mcp.servers.a]\nurl = \"http://h/\"\nauth = \"oauth\"\n", nil, []string{`mcp.servers.a.auth: auth = "oauth" needs server.public_url`}},
		{"[server]\npublic_url = \"https://cg.example\"\n[mcp.servers.a]\nurl = \"http://h/\"\nauth = \"oauth\"\nheaders = {authorization = \"Bearer x\"}\n", nil, []string{"mcp.servers.a.headers: an Authorization header and auth = \"oauth\" are both set"}},
		{"[server]\npublic_url = \"https://cg.example\"\n[mcp.servers.a]\nurl = \"http://h/\"\nauth = \"magic\"\n", nil, []string{`mcp.servers.a.auth: "magic": valid values are none, oauth, token-exchange and user-token`}},
		{"[server]\npublic_url = \"https://cg.example\"\n[mcp.servers.a]\ncommand = \"x\"\nauth = \"user-token\"\n", nil, []string{"needs a streamable-http url"}},
		{"[mcp.servers.a]\nurl = \"http://h/\"\nauth = \"token-exchange\"\n", nil, []string{"needs [auth.oidc]"}},
		{"[auth.oidc]\nissuer = \"https://idp.example\"\n[mcp.servers.a]\nurl = \"http://h/\"\nauth = \"token-exchange\"\n", nil,
			[]string{`mcp.servers.a.client_id: auth = "token-exchange" needs client_id`}},
		{"[mcp.servers.a]\nurl = \"http://h/\"\nclient_id = \"c\"\n", nil, []string{"mcp.servers.a.auth: client_id"}},
		{"[server]\npublic_url = \"cg.example\"\n", nil, []string{`server.public_url: "cg.example" is not an absolute http or https URL`}},
		{"[auth.oidc]\nissuer = \"https://idp.example\"\nclient_id = \"capgate-web\"\n", nil, []string{"auth.oidc.client_id: signing browsers in needs server.public_url"}},
		{"[server]\npublic_url = \"https://cg.example\"\n[auth.oidc]\nissuer = \"https://idp.example\"\nclient_secret_env = \"WEB_SECRET\"\n", nil, []string{"auth.oidc.client_secret_env: is the secret of client_id, which is not set"}},
		{"[server]\npublic_url = \"https://cg.example\"\n[auth.oidc]\nissuer = \"https://idp.example\"\nclient_id = \"capgate-web\"\nclient_secret_env = \"web secret\"\n", nil, []string{`auth.oidc.client_secret_env: "web secret" is not an environment variable name`}},
		{"[mcp.servers.a]\ncommand = \"x\"\nprefix = \"a b\"\n", nil, []string{"mcp.servers.a.prefix"}},
		{"[mcp.servers.a]\ncommand = \"x\"\nrisk = \"SEVERE\"\nside_effects = [\"fs.wipe\"]\n", nil,
			[]string{"mcp.servers.a.risk: unknown risk level", "mcp.servers.a.side_effects[0]: unknown side effect \"fs.wipe\""}},
		{"[mcp.servers.a]\ncommand = \"x\"\n[mcp.servers.a.tools.t]\nname = \"a.b\"\n", nil, []string{`mcp.servers.a.tools.t.name: "a.b" must match`}},
		{"[mcp.servers.a]\ncommand = \"x\"\nenv = {T = \"${MISSING}\"}\n", nil,
			[]string{"capgate.toml: mcp.servers.a.env.T: environment variable MISSING is not set"}},
		{"[policy]\ngrants = [\"${G\"]\n", nil, []string{"policy.grants[0]: unclosed ${"}},
		{"[policy]\ngrants = [\"rye.a b\"]\n", nil, []string{"policy.grants[0]: grant \"rye.a b\" contains white space"}},
		{"[capabilities.providers.Gog]\ncommand = [\"x\"]\n", nil, []string{`capabilities.providers.Gog.namespace: "Gog" must match`}},
		{"[capabilities.providers.gog]\nnamespace = \"gog\"\n", nil, []string{"capabilities.providers.gog.command: required"}},
		{"[capabilities.providers.a]\nnamespace = \"x\"\ncommand = [\"a\"]\n[capabilities.providers.b]\nnamespace = \"x\"\ncommand = [\"b\"]\n", nil,
			[]string{`capabilities.providers.b.namespace: "x" is also the namespace of capabilities.providers.a`}},
		{"[skills.s]\nenv = {lower = \"x\"}\n", nil, []string{"skills.s.env.lower: environment names are UPPER_CASE"}},
		{"[skills.defaults]\nmodel = \"m\"\n", nil, []string{"skills.defaults: only allow_chat_ids"}},
		{"[auth.anonymous]\ngrants = [\"rye.fetch.*\"]\n", nil, []string{"auth.anonymous.sub: required"}},
		{"[store]\nurl = \"mysql://u:pw@h/db\"\n", nil, []string{"capgate.toml: store.url: want a postgres:// or postgresql:// URL"}},
	}
	for _, tt := range tests {
		_, err := parse(t, tt.src, tt.vars)
		if err == nil {
			t.Errorf("%q: no error, want %q", tt.src, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q:\n error %v\n want %q", tt.src, err, w)
			}
		}
	}
}

// TestStoreURL: [store] url expands ${ENV}, as a password would come.
func TestStoreURL(t *testing.T) {
	c, err := parse(t, "[store]\nurl = \"postgres://capgate:${PGPASS}@db:5432/capgate\"\n", map[string]string{"PGPASS": "pw"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.URL != "postgres://capgate:pw@db:5432/capgate" {
		t.Errorf("store.url = %q", c.Store.URL)
	}
	if _, err := parse(t, "[store]\nurl = \"mysql://u:s3cret@h/db\"\n", nil); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a bad url's error %v shows the password or is missing", err)
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "EMPTY": ""}
	tests := map[string]string{
		"plain":          "plain",
		"$A stays":       "$A stays",
		"${A}":           "1",
		"x${A}y${A}":     "x1y1",
		"${B:-two}":      "two",
		"${EMPTY:-dflt}": "dflt",
		"${EMPTY}":       "",
		"${A:-unused}":   "1",
		"cost: $5 ${A}":  "cost: $5 1",
	}
	for in, want := range tests {
		got, err := expand(in, env(vars))
		if err != "" || got != want {
			t.Errorf("expand(%q) = %q, %q; want %q", in, got, err, want)
		}
	}
	if _, err := expand("${1X}", env(vars)); !strings.Contains(err, "not a valid variable reference") {
		t.Errorf("bad name: %q", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if !os.IsNotExist(err) {
		t.Errorf("error %v, want not-exist", err)
	}
}

func TestLimits(t *testing.T) {
	c, err := parse(t, `
[mcp]
max_result_bytes = "2MiB"
[mcp.servers.a]
command = "a"
[mcp.servers.b]
command = "b"
max_result_bytes = 65536
[capabilities]
max_output_bytes = "512KiB"
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MCP.Servers["a"].MaxResultBytes != 2<<20 || c.MCP.Servers["b"].MaxResultBytes != 64<<10 ||
		c.Capabilities.MaxOutputBytes != 512<<10 || c.Extensions.MaxOutputBytes != DefaultMaxOutputBytes {
		t.Errorf("limits: %v %v %v %v", c.MCP.Servers["a"].MaxResultBytes, c.MCP.Servers["b"].MaxResultBytes, c.Capabilities.MaxOutputBytes, c.Extensions.MaxOutputBytes)
	}
	if c, err := parse(t, "", nil); err != nil || c.MCP.MaxResultBytes != DefaultMCPResultBytes || c.Capabilities.MaxOutputBytes != DefaultBridgeOutput {
		t.Errorf("defaults: %v %+v", err, c)
	}
	for src, want := range map[string]string{
		"[mcp]\nmax_result_bytes = \"8 parsecs\"":                     `capgate.toml:2: mcp.max_result_bytes: "8 parsecs" is not a size`,
		"[mcp]\nmax_result_bytes = true":                              `capgate.toml: "true" is not a size`,
		"[extensions]\nmax_output_bytes = 10":                         `capgate.toml: extensions.max_output_bytes: 10 bytes is out of range`,
		"[capabilities]\nmax_output_bytes = \"2GiB\"":                 `capgate.toml: capabilities.max_output_bytes: 2147483648 bytes is out of range`,
		"[mcp.servers.a]\ncommand = \"a\"\nmax_result_bytes = \"1B\"": `capgate.toml: mcp.servers.a.max_result_bytes: 1 bytes is out of range`,
	} {
		if _, err := parse(t, src, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}

func TestAuthHS256(t *testing.T) {
	for _, tt := range []struct {
		src  string
		want bool
	}{
		{``, true},
		{"[auth]\njwks_file = \"jwks.json\"", false},
		{"[auth]\njwks_file = \"jwks.json\"\nallow_hs256 = true", true},
		{"[auth]\nallow_hs256 = true", true},
		{"[auth]\njwks_url = \"https://idp.example/jwks.json\"", false},
		{"[auth.oidc]\nissuer = \"https://idp.example\"", false},
		{"[auth]\nallow_hs256 = true\n[auth.oidc]\nissuer = \"http://127.0.0.1:9000\"", true},
	} {
		c, err := parse(t, tt.src, nil)
		if err != nil {
			t.Fatalf("%q: %v", tt.src, err)
		}
		if c.Auth.HS256() != tt.want {
			t.Errorf("%q: HS256 %v, want %v", tt.src, c.Auth.HS256(), tt.want)
		}
	}
	_, err := parse(t, "[auth]\nallow_hs256 = false", nil)
	if err == nil || !strings.Contains(err.Error(), "capgate.toml: auth.allow_hs256: false with no auth.jwks_file") {
		t.Errorf("allow_hs256 = false alone: %v", err)
	}
}

// TestAuthKeySources: one of jwks_file, jwks_url and [auth.oidc]; keys
// come over https, or http from this machine; the issuer's audience
// defaults to auth.audience.
func TestAuthKeySources(t *testing.T) {
	c, err := parse(t, "[auth]\naudience = \"gw\"\n[auth.oidc]\nissuer = \"https://idp.example\"", nil)
	if err != nil || c.Auth.OIDC.Audience != "gw" {
		t.Fatalf("oidc audience: %v %+v", err, c.Auth.OIDC)
	}
	for src, want := range map[string]string{
		"[auth]\njwks_file = \"k.json\"\njwks_url = \"https://idp.example/k\"": "capgate.toml: auth: set one of jwks_file, jwks_url and [auth.oidc]",
		"[auth]\njwks_url = \"http://idp.example/k\"":                          `capgate.toml: auth.jwks_url: "http://idp.example/k": must be https (http only to a loopback host)`,
		"[auth]\njwks_url = \"jwks.json\"":                                     `capgate.toml: auth.jwks_url: "jwks.json" is not an absolute URL`,
		"[auth.oidc]\naudience = \"x\"":                                        "capgate.toml: auth.oidc.issuer: required",
		"[auth.oidc]\nissuer = \"http://idp.example\"":                         `capgate.toml: auth.oidc.issuer: "http://idp.example": must be https`,
	} {
		if _, err := parse(t, src, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}

// TestSubprocessEnvNames: the operator may pass host variables through to
// packs and providers, but never capgate's own keys.
func TestSubprocessEnvNames(t *testing.T) {
	c, err := parse(t, "[capabilities.providers.gog]\ncommand = [\"g\"]\nenv = [\"GOG_HOME\"]", nil)
	if err != nil || c.Providers()[0].Env[0] != "GOG_HOME" {
		t.Fatalf("provider env: %v", err)
	}
	for _, tt := range []struct{ src, want string }{
		{"[extensions]\nenv = [\"CAPGATE_TOKEN_SECRET\"]", "extensions.env[0]: CAPGATE_TOKEN_SECRET holds capgate's own key"},
		{"[auth]\nsecret_env = \"MY_KEY\"\n[extensions]\nenv = [\"PATH\", \"MY_KEY\"]", "extensions.env[1]: MY_KEY holds capgate's own key"},
		{"[capabilities.providers.gog]\ncommand = [\"g\"]\nenv = [\"CAPGATE_STORE_KEY\"]", "capabilities.providers.gog.env[0]: CAPGATE_STORE_KEY holds"},
		{"[capabilities.providers.gog]\ncommand = [\"g\"]\nenv = [\"ASH_CONTEXT_TOKEN_SECRET\"]", "capabilities.providers.gog.env[0]: ASH_CONTEXT_TOKEN_SECRET holds"},
		{"[capabilities.providers.gog]\ncommand = [\"g\"]\nenv = [\"no-dash\"]", "capabilities.providers.gog.env[0]: \"no-dash\" is not an environment variable name"},
	} {
		if _, err := parse(t, tt.src, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.src, err, tt.want)
		}
	}
}

func TestAuditRotationKeys(t *testing.T) {
	c, err := parse(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if *c.Audit.MaxSize != DefaultAuditMaxSize || c.Audit.MaxFiles != DefaultAuditMaxFiles || c.Audit.Reserve != 0 {
		t.Errorf("defaults: %+v", c.Audit)
	}
	for src, want := range map[string]ByteSize{
		"[audit]\nmax_size = 2097152":   2 << 20,
		"[audit]\nmax_size = \"64MiB\"": 64 << 20,
		"[audit]\nmax_size = \"2 GiB\"": 2 << 30,
		"[audit]\nmax_size = 0":         0,
	} {
		c, err := parse(t, src, nil)
		if err != nil || *c.Audit.MaxSize != want {
			t.Errorf("%s: %+v %v, want %d", src, c, err, want)
		}
	}
	if c, err := parse(t, "[audit]\nreserve = \"256KiB\"", nil); err != nil || c.Audit.Reserve != 256<<10 {
		t.Errorf("reserve: %+v %v", c, err)
	}
	for src, want := range map[string]string{
		"[audit]\nmax_size = \"64 furlongs\"": `capgate.toml:2: audit.max_size: "64 furlongs" is not a size`,
		"[audit]\nmax_size = 4096":            "capgate.toml: audit.max_size: 4096 bytes is too small: want at least 1MiB (1048576), or 0 for no rotation",
		"[audit]\nmax_size = -1":              "capgate.toml: audit.max_size: -1 bytes is too small",
		"[audit]\nmax_files = -2":             "capgate.toml: audit.max_files: -2: want 1 or more rotated files to keep",
		"[audit]\nreserve = 4096":             "capgate.toml: audit.reserve: 4096 bytes is too small: want at least 64KiB (65536)",
		"[audit]\nreserve = \"lots\"":         `capgate.toml:2: audit.reserve: "lots" is not a size`,
	} {
		if _, err := parse(t, src, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s:\n got %v\nwant %s", src, err, want)
		}
	}
}

// [policy.side_effects] takes known tags and allow, acknowledge or deny;
// each bad entry is its own error naming the tag.
func TestSideEffectPolicies(t *testing.T) {
	c, err := parse(t, "[policy.side_effects]\n\"fs.delete\" = \"acknowledge\"\npayments = \"deny\"\n", nil)
	if err != nil || c.Policy.SideEffects["fs.delete"] != "acknowledge" || c.Policy.SideEffects["payments"] != "deny" {
		t.Fatalf("%+v %v", c, err)
	}
	_, err = parse(t, "[policy.side_effects]\n\"fs.remove\" = \"deny\"\n\"fs.delete\" = \"refuse\"\n", nil)
	for _, want := range []string{
		`capgate.toml: policy.side_effects."fs.delete": unknown side-effect policy "refuse": want allow, acknowledge or deny`,
		`capgate.toml: policy.side_effects."fs.remove": unknown side effect "fs.remove"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant %s", err, want)
		}
	}
}
