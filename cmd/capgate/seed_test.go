package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
)

// TestCapabilityListGroupChat: capability.list, through the real CLI and
// a real serve, lists a group-chat caller only what it may call; asked
// for unavailable ones too, it shows the sensitive capability as
// unavailable with the chat gate's reason. A private chat sees it callable.
func TestCapabilityListGroupChat(t *testing.T) {
	t.Parallel()
	s := startServe(t, "")
	type entry struct {
		ID                string
		Available         bool
		UnavailableReason string `json:"unavailable_reason"`
	}
	list := func(tok string, args ...string) map[string]entry {
		t.Helper()
		out, errb, code := s.as(t, tok, append([]string{"list"}, args...)...)
		var res struct{ Capabilities []entry }
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("list %v: %d %s %s", args, code, out, errb)
		}
		m := map[string]entry{}
		for _, c := range res.Capabilities {
			m[c.ID] = c
		}
		return m
	}
	group := s.mint(t, "alice", "group")
	if got := list(group); len(got) == 0 {
		t.Fatal("a group caller sees nothing")
	} else if _, ok := got["gog.email"]; ok {
		t.Errorf("a group caller is listed gog.email (sensitive, private only): %+v", got["gog.email"])
	}
	all := list(group, "--include-unavailable")
	if e, ok := all["gog.email"]; !ok || e.Available || !strings.Contains(e.UnavailableReason, "capability_access_denied") ||
		!strings.Contains(e.UnavailableReason, "private") {
		t.Errorf("gog.email with --include-unavailable for a group caller = %+v, want unavailable with the chat reason", e)
	}
	if e := all["gog.calendar"]; !e.Available || e.UnavailableReason != "" {
		t.Errorf("gog.calendar (group allowed) = %+v, want available", e)
	}
	if e, ok := list(s.mint(t, "alice", "private"))["gog.email"]; !ok || !e.Available {
		t.Errorf("gog.email for a private caller = %+v, want available", e)
	}
}

// TestAshGogDefaultWiring: a carried-over Ash config whose only gog line
// is [skills.gog] enabled = true gets Ash's default provider wiring
// (`gogcli bridge`, namespace gog): config check says so, and a real serve
// runs the gogcli it finds in PATH (here the bridge fixture) and lists its
// capabilities.
func TestAshGogDefaultWiring(t *testing.T) {
	t.Parallel()
	const ash = "\n[policy]\ngrants = [\"rye.fetch.*\"]\n\n[skills.gog]\nenabled = true\n"
	path := filepath.Join(t.TempDir(), "capgate.toml")
	if err := os.WriteFile(path, []byte("[server]\ndata_dir = \"data\"\n"+ash), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"config", "check", "--config", path}, &out, &errb); code != 0 ||
		out.String() != path+":7: skills.gog: enabled = true applies Ash's default provider wiring: command = [\"gogcli\", \"bridge\"], namespace = \"gog\"\n"+path+": OK\n" {
		t.Errorf("config check: exit %d\nstdout %q\nstderr %q", code, out.String(), errb.String())
	}

	bin := t.TempDir()
	if err := os.Symlink(testkit.Build(t, testkit.BridgeFixture), filepath.Join(bin, "gogcli")); err != nil {
		t.Fatal(err)
	}
	s := fromCapgate(testkit.StartCapgate(t, testkit.Capgate{Config: ash, Env: []string{"PATH=" + bin + ":" + os.Getenv("PATH")}}))
	stdout, stderr, code := s.as(t, s.mint(t, "alice", "private"), "list")
	if code != 0 || !strings.Contains(stdout, `"id": "gog.email"`) {
		t.Errorf("capability list with [skills.gog] enabled = true: %d\n%s\n%s\nserve logged:\n%s", code, stdout, stderr, s.logs())
	}
}

// auditRecords waits until serve's audit file holds records with
// request_id id whose types are want, in that order, and returns them.
func (s *served) auditRecords(t *testing.T, id string, want ...string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	var types []string
	if !testkit.Poll(10*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, "data", "audit.jsonl"))
		recs, types = nil, nil
		for _, line := range strings.Split(string(b), "\n") {
			var e map[string]any
			if json.Unmarshal([]byte(line), &e) == nil && e["request_id"] == id {
				recs = append(recs, e)
				types = append(types, e["type"].(string))
			}
		}
		return strings.Join(types, " ") == strings.Join(want, " ")
	}) {
		t.Fatalf("records of %s: %v, want %v", id, types, want)
	}
	return recs
}

// TestAgentOSInvocation: over the real RPC of a real serve, AgentOS's
// mode "execution" runs the call as no mode does; the caller's own
// invocation_id is kept beside capgate's, echoed as client_invocation_id
// (result and error) and recorded on its invocation_start and tool_call
// records (the others carry the invocation id that links them); and each
// call's first record is an invocation_start written at admission, before
// any gate, denied calls included.
func TestAgentOSInvocation(t *testing.T) {
	t.Parallel()
	s := startServe(t, "")
	alice := s.mint(t, "alice", "private")
	res, e := s.rpcCall(t, "capability.invoke", map[string]any{"context_token": alice, "capability": "mcp:fx:t_00",
		"mode": "execution", "invocation_id": "agentos-run-7", "input": map[string]any{}})
	var out struct {
		OK                 bool
		InvocationID       string `json:"invocation_id"`
		ClientInvocationID string `json:"client_invocation_id"`
	}
	if e != nil || json.Unmarshal(res, &out) != nil || !out.OK || !invocationID.MatchString(out.InvocationID) ||
		out.ClientInvocationID != "agentos-run-7" {
		t.Fatalf("invoke with mode execution: %s %+v", res, e)
	}
	recs := s.auditRecords(t, out.InvocationID, "invocation_start", "grant_check", "tool_call")
	for _, r := range []map[string]any{recs[0], recs[2]} {
		if r["client_invocation_id"] != "agentos-run-7" {
			t.Errorf("%s record without the client's id: %v", r["type"], r)
		}
	}
	if recs[0]["sub"] != "alice" || recs[0]["tool_name"] != "mcp:fx:t_00" || recs[0]["decision"] != nil {
		t.Errorf("invocation_start = %v, want who and what, no decision", recs[0])
	}

	// A call refused at the first gate still starts with its record.
	_, e = s.rpcCall(t, "capability.invoke", map[string]any{"context_token": alice, "capability": "mcp:fx:nope",
		"invocation_id": "agentos-run-8", "input": map[string]any{}})
	if e == nil || e.Data.Code != "capability_not_found" || e.Data.ClientInvocationID != "agentos-run-8" {
		t.Fatalf("missing tool: %+v", e)
	}
	s.auditRecords(t, e.Data.InvocationID, "invocation_start", "tool_call")

	for _, bad := range []map[string]any{{"mode": "dry"}, {"invocation_id": "a\nb"}, {"invocation_id": strings.Repeat("x", 129)}} {
		params := map[string]any{"context_token": alice, "capability": "mcp:fx:t_00", "input": map[string]any{}}
		for k, v := range bad {
			params[k] = v
		}
		if _, e := s.rpcCall(t, "capability.invoke", params); e == nil || e.Code != -32602 {
			t.Errorf("invoke with %v: %+v, want invalid params", bad, e)
		}
	}
}

// TestRiskNameAndDescription: `capgate tools show` of an extension command
// named get_thing whose description says it deletes all user data is
// HIGH with fs.delete, by the description's word: inference takes the
// higher of the name's and the description's evidence.
func TestRiskNameAndDescription(t *testing.T) {
	dir := t.TempDir()
	pack := filepath.Join(dir, "packs", "things")
	if err := os.MkdirAll(pack, 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := "id: tools.things\ncommands:\n  get_thing:\n    description: Deletes all user data permanently\n    run: [\"true\"]\n" +
		"  list_things:\n    description: Lists the things there are\n    run: [\"true\"]\n"
	cfg := filepath.Join(dir, "capgate.toml")
	if os.WriteFile(filepath.Join(pack, "extension.yaml"), []byte(manifest), 0o644) != nil ||
		os.WriteFile(cfg, []byte("[extensions]\npaths = [\"packs\"]\n"), 0o644) != nil {
		t.Fatal("write")
	}
	show := func(id string) map[string]any {
		var out, errb bytes.Buffer
		if code := run([]string{"tools", "show", id, "--config", cfg}, &out, &errb); code != 0 {
			t.Fatalf("tools show %s: %d %s", id, code, errb.String())
		}
		var d struct{ Risk map[string]any }
		if err := json.Unmarshal(out.Bytes(), &d); err != nil {
			t.Fatalf("tools show %s: %v\n%s", id, err, out.String())
		}
		return d.Risk
	}
	r := show("ext:tools.things:get_thing")
	if r["level"] != "HIGH" || !strings.Contains(jsonOf(r["side_effects"]), "fs.delete") ||
		!strings.Contains(jsonOf(r["rules"]), `word \"delete\" in description → HIGH`) {
		t.Errorf("get_thing described as deleting everything: %v", r)
	}
	if r := show("ext:tools.things:list_things"); r["level"] != "LOW" {
		t.Errorf("list_things: %v", r)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestQuickstartTokenLasts: the token command serve's banner offers (with
// the development key) makes a token that lasts 12 hours, fit to paste
// into a client's config, and it works against that serve.
func TestQuickstartTokenLasts(t *testing.T) {
	t.Parallel()
	cg := testkit.StartCapgate(t, testkit.Capgate{NoSecret: true, Config: "\n[policy]\ngrants = [\"rye.fetch.*\"]\n"})
	var cmdline string
	for _, l := range strings.Split(cg.Banner, "\n") {
		if _, c, ok := strings.Cut(l, "a dev token "); ok {
			cmdline = strings.TrimSpace(c)
		}
	}
	args := strings.Fields(cmdline)
	if len(args) < 2 || !strings.HasSuffix(cmdline, "--sub you --ttl 12h") {
		t.Fatalf("banner's dev token line %q, want a token mint --ttl 12h\n%s", cmdline, cg.Banner)
	}
	s := fromCapgate(cg)
	tok, errb, code := s.run(t, nil, args[1:]...)
	if code != 0 || !strings.Contains(errb, "(in 12h0m0s)") {
		t.Fatalf("%s: %d %s", cmdline, code, errb)
	}
	if _, errb, code := s.as(t, strings.TrimSpace(tok), "list"); code != 0 {
		t.Errorf("the banner's token against its serve: %d %s", code, errb)
	}
}

// TestListenOverride: CAPGATE_LISTEN moves a real serve off [server]
// listen; `capability list --config` finds it there (and at [server]
// listen without the override) instead of assuming :8787; and a serve
// whose port is taken exits 2 naming where the address came from.
func TestListenOverride(t *testing.T) {
	t.Parallel()
	moved := testkit.FreeAddr(t)
	cg := testkit.StartCapgate(t, testkit.Capgate{Config: "\n[policy]\ngrants = [\"rye.fetch.*\"]\n", Env: []string{"CAPGATE_LISTEN=" + moved}})
	s := fromCapgate(cg)
	if !strings.Contains(cg.Banner, "http://"+moved+"/rpc") {
		t.Fatalf("banner with CAPGATE_LISTEN=%s:\n%s", moved, cg.Banner)
	}
	tok := s.mint(t, "alice", "private")
	env := []string{"ASH_CONTEXT_TOKEN=" + tok, "CAPGATE_URL=", "CAPGATE_LISTEN=" + moved}
	if out, errb, code := s.run(t, env, "capability", "list", "--config", s.config); code != 0 || !strings.Contains(out, "capabilities") {
		t.Errorf("capability list --config with CAPGATE_LISTEN: %d %s %s", code, out, errb)
	}

	// Another serve of the same config on the port the first holds.
	data := filepath.Join(t.TempDir(), "data")
	for _, tc := range []struct {
		env  []string
		args []string
		from string
	}{
		{[]string{"CAPGATE_LISTEN=" + moved}, nil, "CAPGATE_LISTEN"},
		{nil, []string{"--listen", moved}, "--listen"},
	} {
		cfg := filepath.Join(t.TempDir(), "capgate.toml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("[server]\nlisten = %q\ndata_dir = %q\nsocket = \"-\"\n", testkit.FreeAddr(t), data)), 0o600)
		_, errb, code := s.run(t, append(tc.env, "CAPGATE_TOKEN_SECRET=serve-test-secret-value-9f8e7d"), append([]string{"serve", "--config", cfg}, tc.args...)...)
		if code != 2 || !strings.Contains(errb, tc.from+` = "`+moved+`"`) || !strings.Contains(errb, "already in use") ||
			!strings.Contains(errb, "[server] listen") {
			t.Errorf("serve on a taken port via %s: exit %d\n%s", tc.from, code, errb)
		}
	}
	cfg := filepath.Join(t.TempDir(), "capgate.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("[server]\nlisten = %q\ndata_dir = %q\nsocket = \"-\"\n", moved, data)), 0o600)
	_, errb, code := s.run(t, []string{"CAPGATE_TOKEN_SECRET=serve-test-secret-value-9f8e7d", "CAPGATE_LISTEN="}, "serve", "--config", cfg)
	if code != 2 || !strings.Contains(errb, cfg+`: [server] listen = "`+moved+`": the address is already in use`) {
		t.Errorf("serve on a taken [server] listen: exit %d\n%s", code, errb)
	}
	// Without an override, --config finds it at [server] listen.
	out, errb, code := s.run(t, []string{"ASH_CONTEXT_TOKEN=" + tok, "CAPGATE_URL=", "CAPGATE_LISTEN="}, "capability", "list", "--config", cfg)
	if code != 0 || !strings.Contains(out, "capabilities") {
		t.Errorf("capability list --config at [server] listen: %d %s %s", code, out, errb)
	}
}
