package ext

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

func discover(t *testing.T, opts Options) map[string]*Pack {
	t.Helper()
	packs, err := Discover([]string{"testdata/packs"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*Pack{}
	for _, p := range packs {
		out[p.ID()] = p
	}
	return out
}

func toolOf(t *testing.T, p *Pack, name string) *tool.Descriptor {
	t.Helper()
	ds, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("pack %s has no tool %s", p.ID(), name)
	return nil
}

func call(t *testing.T, p *Pack, name, input string) (*tool.Result, error) {
	t.Helper()
	return p.Call(context.Background(), tool.Call{Tool: toolOf(t, p, name), Input: json.RawMessage(input)})
}

func TestDiscoverAndList(t *testing.T) {
	packs := discover(t, Options{})
	if len(packs) != 2 || packs["tools.echo"] == nil || packs["tools.other"] == nil {
		t.Fatalf("packs %v, want tools.echo and tools.other (notapack skipped)", packs)
	}
	echo := toolOf(t, packs["tools.echo"], "echo")
	if echo.ID != "ext:tools.echo:echo" || echo.Kind != tool.KindExt || echo.Source != "tools.echo" || !echo.Available {
		t.Errorf("descriptor %+v", echo)
	}
	if string(echo.InputSchema) != `{"properties":{"msg":{"type":"string"}},"required":["msg"],"type":"object"}` {
		t.Errorf("input schema %s", echo.InputSchema)
	}
	if echo.Risk.Level != risk.Low || echo.Risk.LevelFrom != risk.FromSource || len(echo.Risk.Effects) != 0 || echo.Risk.EffectsFrom != risk.FromSource {
		t.Errorf("declared risk %+v", echo.Risk)
	}
	// Nothing declared: the pack's network permission makes it HIGH, and
	// the name adds fs.delete.
	del := toolOf(t, packs["tools.echo"], "delete_things")
	if del.Risk.Level != risk.High || del.Risk.LevelFrom != risk.FromInference || !del.Mutating {
		t.Errorf("inferred risk %+v", del.Risk)
	}
	if got := del.Risk.Effects; len(got) != 2 || got[0] != risk.FSDelete || got[1] != risk.NetworkHTTP {
		t.Errorf("inferred effects %v", got)
	}
	if s := string(toolOf(t, packs["tools.other"], "get").InputSchema); s != `{"type":"object"}` {
		t.Errorf("default input schema %s", s)
	}
}

func TestCallEcho(t *testing.T) {
	p := discover(t, Options{})["tools.echo"]
	r, err := call(t, p, "echo", `{"msg":"hello"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"echo": {"msg":"hello"}, "cwd": "echo"}`
	if string(r.Structured) != want {
		t.Errorf("structured %s, want %s", r.Structured, want)
	}
	var block struct{ Type, Text string }
	if err := json.Unmarshal(r.Content[0], &block); err != nil || block.Type != "text" || block.Text != want {
		t.Errorf("content %s", r.Content[0])
	}
}

func TestCallMCPResult(t *testing.T) {
	p := discover(t, Options{})["tools.echo"]
	r, err := call(t, p, "mcp", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if !r.IsError || len(r.Content) != 1 || !strings.Contains(string(r.Content[0]), `"hi"`) {
		t.Errorf("result %+v", r)
	}
}

func TestEnvironmentIsScrubbed(t *testing.T) {
	t.Setenv("CAPGATE_TEST_SECRET", "s3cr3t-value")
	t.Setenv("CAPGATE_TEST_GRANTED", "granted-value")
	p := discover(t, Options{Env: []string{"CAPGATE_TEST_GRANTED"}})["tools.echo"]
	r, err := call(t, p, "env", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Home, Secret, Granted string
		PathSet               bool `json:"path_set"`
	}
	if err := json.Unmarshal(r.Structured, &got); err != nil {
		t.Fatal(err)
	}
	if got.Secret != "" {
		t.Errorf("the command saw a host secret: %q", got.Secret)
	}
	if got.Granted != "granted-value" || !got.PathSet || got.Home != os.Getenv("HOME") {
		t.Errorf("allowed variables missing: %+v", got)
	}
}

func TestCallFailures(t *testing.T) {
	p := discover(t, Options{})["tools.echo"]
	tests := []struct {
		name string
		code tool.Code
		msg  string
	}{
		{"fail", tool.CodeBackendUnavailable, "ext:tools.echo:fail exited with status 3 (its stderr is in capgate's log)"},
		{"badjson", tool.CodeInvalidOutput, "ext:tools.echo:badjson wrote invalid JSON"},
	}
	for _, tt := range tests {
		_, err := call(t, p, tt.name, `{}`)
		// A command's stderr goes to the log, never to the caller.
		if tool.ErrorCode(err) != tt.code || !strings.Contains(tool.ErrorMessage(err), tt.msg) || strings.Contains(tool.ErrorMessage(err), "disk on fire") {
			t.Errorf("%s: %s %q, want %s %q", tt.name, tool.ErrorCode(err), tool.ErrorMessage(err), tt.code, tt.msg)
		}
	}
	small := discover(t, Options{MaxOutput: 1000})["tools.echo"]
	_, err := call(t, small, "big", `{}`)
	if tool.ErrorCode(err) != tool.CodeInvalidOutput || !strings.Contains(tool.ErrorMessage(err), "limit of 1000 bytes") {
		t.Errorf("big: %v", err)
	}
}

// TestTimeoutKillsProcessGroup runs a command that starts a child and
// hangs: the call must end at its timeout and the child must be gone.
func TestTimeoutKillsProcessGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("PIDFILE", pidfile)
	p := discover(t, Options{Env: []string{"PIDFILE"}})["tools.echo"]
	start := time.Now()
	ended := make(chan error, 1)
	go func() { _, err := call(t, p, "slow", `{}`); ended <- err }()
	// The child's pid in the tool's PID namespace, as this machine knows it.
	var pid int
	testkit.WaitFor(t, 10*time.Second, "the child to start", func() bool {
		b, _ := os.ReadFile(pidfile)
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pid = testkit.HostPID(n, os.Getpid())
		}
		return pid != 0
	})
	err := <-ended
	if tool.ErrorCode(err) != tool.CodeBackendUnavailable || !strings.Contains(tool.ErrorMessage(err), "timed out after 2s") {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the call took %v; the timeout was 2s", d)
	}
	// The child was killed with its group; it may linger briefly as a zombie
	// of init, so look at its state rather than only at existence.
	var stat []byte
	if !testkit.Poll(5*time.Second, func() bool {
		var err error
		stat, err = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(stat), ") Z ")
	}) {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
		t.Fatalf("child %d outlived the call: %s", pid, stat)
	}
}

func TestCallCancelled(t *testing.T) {
	p := discover(t, Options{Env: []string{"PIDFILE"}})["tools.echo"]
	t.Setenv("PIDFILE", filepath.Join(t.TempDir(), "pid"))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := p.Call(ctx, tool.Call{Tool: toolOf(t, p, "slow")})
	if tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Errorf("error %v", err)
	}
}

func TestManifestErrors(t *testing.T) {
	tests := []struct {
		manifest string
		want     []string
	}{
		{"id: x\ncommands:\n  get:\n    run: [a]\n    rsik: LOW\n", []string{"extension.yaml:5: unknown key rsik"}},
		{"id: Bad_ID\ncommands:\n  get: {run: [a]}\n", []string{`extension.yaml: id: "Bad_ID" must match`}},
		{"id: x\n", []string{"extension.yaml: commands: required"}},
		{"id: x\ncommands:\n  get: {description: d}\n", []string{"extension.yaml: commands.get.run: required"}},
		{"id: x\ncommands:\n  get: {run: [a], risk: SEVERE}\n", []string{`extension.yaml: commands.get.risk: unknown risk level "SEVERE"`}},
		{"id: x\ncommands:\n  get: {run: [a], side_effects: [fs.wipe]}\n", []string{`extension.yaml: commands.get: side_effects[0]: unknown side effect "fs.wipe"`}},
		{"id: x\ncommands:\n  get: {run: [a], input_schema: [1]}\n", []string{"commands.get.input_schema: must be a JSON Schema object"}},
		{"id: x\ncommands:\n  \"a b\": {run: [a]}\n", []string{`command name "a b"`}},
		{"id: x\ncommands:\n  get: {run: [a], timeout: soon}\n", []string{`commands.get.timeout: "soon" is not a positive duration`}},
		{"id: [x\n", []string{"extension.yaml:"}},
		{"id: x\ncommands:\n  get: {run: [a], capabilities: {network: sometimes}}\n",
			[]string{`extension.yaml: commands.get.capabilities.network: "sometimes" is not one of none|outbound`}},
		{"id: x\ncommands:\n  get: {run: [a], capabilities: {disk: none}}\n",
			[]string{`extension.yaml: commands.get.capabilities: unknown key "disk"`}},
		{"id: x\ncommands:\n  get: {run: [a], purity: clean}\n",
			[]string{`extension.yaml: commands.get.purity: "clean" is not pure`}},
		{"id: x\ncommands:\n  get: {run: [a], purity: pure, capabilities: {network: none}}\n",
			[]string{`extension.yaml: commands.get.purity: pure guarantees everything`}},
		{"id: x\ncapabilities: {network: never}\ncommands:\n  get: {run: [a]}\n",
			[]string{`extension.yaml: capabilities.network: "never" is not one of none|outbound`}},
		{"id: x\ncapabilities: {secrets: [API_KEY]}\ncommands:\n  get: {run: [a]}\n",
			[]string{`extension.yaml: capabilities.secrets: declare secrets per command`}},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte(tt.manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir, Options{})
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q:\n error %v\n want %q", tt.manifest, err, w)
			}
		}
	}
}

func TestDuplicatePackIDs(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, d, ManifestFile), []byte("id: same\ncommands: {get: {run: [x]}}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Discover([]string{root}, Options{})
	if err == nil || !strings.Contains(err.Error(), `id "same" is also the id of`) {
		t.Errorf("error %v", err)
	}
}
