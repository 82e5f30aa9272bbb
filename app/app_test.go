package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

func TestMain(m *testing.M) {
	testkit.Programs(testkit.BridgeFixture, testkit.MCPFixture)
	testkit.Main(m)
}

const testSecret = "app-test-secret-0123456789abcdef"

// load writes src as dir/capgate.toml and loads it.
func load(t *testing.T, dir, src string) *config.Config {
	t.Helper()
	path := filepath.Join(dir, "capgate.toml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func open(t *testing.T, cfg *config.Config) *App {
	t.Helper()
	lookup := func(k string) (string, bool) {
		if k == config.DefaultSecretEnv {
			return testSecret, true
		}
		return os.LookupEnv(k)
	}
	a, err := Open(context.Background(), cfg, Options{LookupEnv: lookup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestOpenFromConfig builds capgate from a config naming an extension
// pack directory, a bridge provider and an upstream MCP server with the
// operator's words on its tools, all real processes: the catalog carries
// those words, the policy's grants decide calls, and the token key is the
// configured variable's.
func TestOpenFromConfig(t *testing.T) {
	packs, _ := filepath.Abs("../sources/ext/testdata/packs")
	dir := t.TempDir()
	a := open(t, load(t, dir, fmt.Sprintf(`
[server]
data_dir = "data"
socket = "-"

[policy]
grants = ["rye.fetch.tool.*", "rye.execute.tool.mcp.fx.echo"]

[extensions]
paths = [%q]

[capabilities.providers.gog]
command = [%q]

[mcp.servers.fx]
command = %q
risk = "HIGH"

[mcp.servers.fx.tools.echo]
risk = "LOW"
name = "say"

[mcp.servers.fx.tools.mutate]
hidden = true
`, packs, testkit.Build(t, testkit.BridgeFixture), testkit.Build(t, testkit.MCPFixture))))

	s := a.Registry.Snapshot()
	counts := map[tool.Kind]int{}
	for _, d := range s.Tools {
		counts[d.Kind]++
	}
	// ext: 8 + 1 commands; bridge: 3 operations; mcp: 28 less mutate.
	if counts[tool.KindExt] != 9 || counts[tool.KindBridge] != 3 || counts[tool.KindMCP] != 27 {
		t.Errorf("catalog by kind %v", counts)
	}
	say, ok := s.ByExposedName("say")
	if !ok || say.ID != "mcp:fx:echo" || say.Risk.Level.String() != "LOW" || say.Risk.LevelFrom != "operator" {
		t.Errorf("echo with operator overrides: %+v", say)
	}
	if d, _ := s.Lookup("mcp:fx:slow"); d.Risk.Level.String() != "HIGH" || d.Risk.LevelFrom != "operator" || d.ExposedName != "fx__slow" {
		t.Errorf("server default risk: %+v", d)
	}

	if !a.HS256 || a.SecretSource != "$"+config.DefaultSecretEnv {
		t.Errorf("token key: HS256 %v from %q", a.HS256, a.SecretSource)
	}
	raw, err := token.Mint(token.ParseSecret(testSecret), token.Claims{Sub: "alice"}, token.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Router.Authenticate(raw)
	if err != nil {
		t.Fatal(err)
	}
	call := func(id, input string) error {
		_, err := a.Router.Call(context.Background(), c, router.Request{Tool: id, Input: json.RawMessage(input), Protocol: "test"})
		return err
	}
	if err := call("mcp:fx:echo", `{"message":"x"}`); err != nil {
		t.Errorf("a granted call: %v", err)
	}
	if err := call("bridge:gog:email.list_messages", `{}`); tool.ErrorCode(err) != tool.CodePermissionDenied {
		t.Errorf("a call the policy does not grant: %v", err)
	}
}

// TestOpenPinsBesideTheConfig: with policy.require_lock, a tool is served
// only when capgate.lock beside the config pins it; with no capgate.lock
// at all, none is.
func TestOpenPinsBesideTheConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := load(t, dir, fmt.Sprintf("[server]\ndata_dir = \"data\"\nsocket = \"-\"\n[policy]\nrequire_lock = true\n[mcp.servers.fx]\ncommand = %q\n",
		testkit.Build(t, testkit.MCPFixture)))
	if got, want := LockPath(cfg), filepath.Join(dir, registry.LockFile); got != want {
		t.Errorf("LockPath %s, want %s", got, want)
	}
	nolock := open(t, cfg)
	if d, ok := nolock.Registry.Snapshot().Lookup("mcp:fx:echo"); !ok || !strings.Contains(d.Quarantined, "require_lock") {
		t.Fatalf("echo, no capgate.lock at all: %+v", d)
	}
	nolock.Close()
	if err := os.WriteFile(LockPath(cfg), []byte("mcp:fx:other sha256:00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first := open(t, cfg)
	d, ok := first.Registry.Snapshot().Lookup("mcp:fx:echo")
	if !ok || d.Quarantined == "" {
		t.Fatalf("echo, not pinned: %+v", d)
	}
	if err := registry.WriteLock(LockPath(cfg), first.Registry.Snapshot().Tools); err != nil {
		t.Fatal(err)
	}
	first.Close()
	if d, _ := open(t, cfg).Registry.Snapshot().Lookup("mcp:fx:echo"); d.Quarantined != "" {
		t.Errorf("echo, pinned: quarantined: %s", d.Quarantined)
	}
}

// TestSkillSettings: [skills.NAME] reaches skills as written; an empty
// allow_chat_ids stays an empty list (no chat), unlike a missing one
// (the defaults').
func TestSkillSettings(t *testing.T) {
	cfg := load(t, t.TempDir(), `
[skills.defaults]
allow_chat_ids = ["100"]

[skills.email]
model = "large"
allow_chat_ids = []
env = { GOG_ACCOUNT = "me@example.com" }

[skills.deploy]
enabled = false
`)
	got := SkillSettings(cfg.Skills)
	if d := got["deploy"]; d.Enabled == nil || *d.Enabled {
		t.Errorf("deploy: %+v", d)
	}
	e := got["email"]
	if e.Model != "large" || e.AllowChatIDs == nil || len(e.AllowChatIDs) != 0 || !reflect.DeepEqual(e.Env, map[string]string{"GOG_ACCOUNT": "me@example.com"}) {
		t.Errorf("email: %+v", e)
	}
	if d := got["defaults"]; !reflect.DeepEqual(d.AllowChatIDs, []string{"100"}) || d.Enabled != nil {
		t.Errorf("defaults: %+v", d)
	}
}

// TestDevSecretMadeOnceByManyAtOnce: processes starting together on one
// data dir (replicas, serve and a CLI) all get the one development key.
func TestDevSecretMadeOnceByManyAtOnce(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Parse("capgate.toml", []byte("[server]\ndata_dir = \"data\"\n"), dir, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) (string, bool) { return "", false }
	secrets := make([]string, 16)
	errs := make([]error, len(secrets))
	var wg sync.WaitGroup
	for i := range secrets {
		wg.Go(func() {
			b, _, err := Secret(cfg, none)
			secrets[i], errs[i] = string(b), err
		})
	}
	wg.Wait()
	for i := range secrets {
		if errs[i] != nil || secrets[i] == "" || secrets[i] != secrets[0] {
			t.Fatalf("Secret %d of %d at once: %v (same key as the first: %v)", i, len(secrets), errs[i], secrets[i] == secrets[0])
		}
	}
}
