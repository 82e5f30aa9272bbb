package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/token"
	"github.com/capgate/capgate/tool"
)

// shape is what a JSON object must hold: each key with its JSON kind
// (string, number, bool, array, object). An array's elements are checked
// with elem[key].
type shape struct {
	keys map[string]string
	elem map[string]shape
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// check reports each key of s that v lacks or holds as another kind.
func (s shape) check(t *testing.T, where string, v any) {
	t.Helper()
	obj, ok := v.(map[string]any)
	if !ok {
		t.Errorf("%s: %s, want an object", where, jsonKind(v))
		return
	}
	for k, kind := range s.keys {
		got, has := obj[k]
		if !has || jsonKind(got) != kind {
			t.Errorf("%s: %q is %s (present %v), want %s", where, k, jsonKind(got), has, kind)
			continue
		}
		if es, ok := s.elem[k]; ok {
			for i, e := range got.([]any) {
				es.check(t, fmt.Sprintf("%s.%s[%d]", where, k, i), e)
			}
		}
	}
}

// list is a shape for a JSON array of objects of shape elem, with at
// least min of them.
type list struct {
	elem shape
	min  int
}

// TestJSONShapes runs the real binary's commands with --json: each prints
// one JSON document of its documented shape on stdout (README "JSON
// output"), and each fails with one {"error":{"code","message"}} line on
// stderr, with the text form's exit status.
func TestJSONShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	bin := testkit.Build(t, testkit.CapgatePkg)
	dir := t.TempDir()
	quickstart, err := filepath.Abs(filepath.Join("..", "..", "examples", "quickstart"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "capgate.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
data_dir = "data"
public_url = "http://127.0.0.1:1"

[extensions]
paths = [%q]

[mcp.servers.wiki]
url = "http://127.0.0.1:9/mcp"
auth = "user-token"
`, filepath.Join(quickstart, "extensions"))), 0o600); err != nil {
		t.Fatal(err)
	}
	// One live approval in the store under data_dir.
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "data"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	input := []byte(`{"text":"hello"}`)
	if _, err := st.RequestApproval(ctx, "alice", "ext:notes:count_words", audit.HashInput(input), input, time.Hour); err != nil {
		t.Fatal(err)
	}
	other := []byte(`{"text":"approve me"}`)
	toApprove, err := st.RequestApproval(ctx, "alice", "ext:notes:count_words", audit.HashInput(other), other, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	// A serve for the capability RPC: alice may count words, unless her
	// token narrows her to fetching.
	srv := testkit.StartCapgate(t, testkit.Capgate{Config: fmt.Sprintf(`[extensions]
paths = [%q]
[policy]
grants = ["rye.fetch.*", "rye.execute.tool.ext.notes.*"]
`, filepath.Join(quickstart, "extensions"))})
	rpcURL := srv.URL + "/rpc"
	// The subtests that use these run when the package's other parallel
	// tests let them: on a loaded machine that was more than the default
	// five minutes after this, and the tokens had expired.
	until := time.Now().Add(time.Hour)
	allowed := "ASH_CONTEXT_TOKEN=" + srv.Token(t, token.Claims{Sub: "alice", ExpiresAt: until})
	narrowed := "ASH_CONTEXT_TOKEN=" + srv.Token(t, token.Claims{Sub: "alice", Caps: []string{"rye.fetch.*"}, ExpiresAt: until})
	// An intact audit log and a broken one.
	intact, _ := auditLog(t, t.TempDir(), 3)
	broken, lines := auditLog(t, t.TempDir(), 3)
	lines[1] = strings.Replace(lines[1], "user-1", "user-2", 1)
	if err := os.WriteFile(broken, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.toml")
	// tools lock writes capgate.lock beside its config: a copy of its own.
	lockDir := t.TempDir()
	lockCfg := filepath.Join(lockDir, "capgate.toml")
	if b, err := os.ReadFile(cfg); err != nil || os.WriteFile(lockCfg, b, 0o600) != nil {
		t.Fatal("copying the config", err)
	}
	consoleCfg := filepath.Join(t.TempDir(), "capgate.toml")
	if err := os.WriteFile(consoleCfg, []byte("[server]\ndata_dir = \"data\"\n[console]\nlisten = \"127.0.0.1:18788\"\napprovers = [\"ops\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badSkill := filepath.Join(t.TempDir(), "bad.md")
	if err := os.WriteFile(badSkill, []byte("no front matter here\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	descriptor := shape{keys: map[string]string{"id": "string", "kind": "string", "source": "string", "name": "string",
		"exposed_name": "string", "description": "string", "risk": "object", "annotations": "object", "available": "bool"}}
	auditLogShape := shape{keys: map[string]string{"file": "string", "state": "string", "problem": "string", "line": "number",
		"lines": "number", "head": "string", "files": "array", "first_seq": "number", "sidecar": "bool", "keyed": "bool"}}

	approval := shape{keys: map[string]string{"id": "string", "sub": "string",
		"tool_id": "string", "input_hash": "string", "state": "string", "created_at": "string", "expires_at": "string",
		"input": "string", "input_size": "number"}}
	for _, tc := range []struct {
		name string
		args []string
		exit int
		out  any    // shape or list of stdout; nil: nothing on stdout
		code string // the error code on stderr; "": no stderr
		also func(t *testing.T, v any)
	}{
		{"version", []string{"version", "--json"}, 0,
			shape{keys: map[string]string{"version": "string", "modified": "bool", "go_version": "string", "platform": "string"}}, "", nil},
		{"version/error", []string{"version", "--json", "extra"}, 2, nil, errCodeUsage, nil},
		{"check", []string{"check", "--json", "--grant", "rye.fetch.*", "fetch", "directive"}, 0,
			shape{keys: map[string]string{"required": "string", "allowed": "bool", "reason": "string", "matched": "array", "grants": "object"}}, "", nil},
		{"check/denied", []string{"check", "--json", "--grant", "rye.fetch.*", "execute", "tool", "x"}, 1,
			shape{keys: map[string]string{"required": "string", "allowed": "bool", "reason": "string", "suggest": "array"}}, "", nil},
		{"check/error", []string{"check", "--json", "bogus", "tool"}, 2, nil, errCodeUsage, nil},
		{"perms", []string{"perms", "--json", "testdata/deploy.md"}, 0,
			shape{keys: map[string]string{"file": "string", "line": "number", "grants": "array", "acknowledged": "array"}}, "", nil},
		{"perms/error", []string{"perms", "--json", "testdata/broken.md"}, 2, nil, errCodeUsage, nil},
		{"config check", []string{"config", "check", "--json", "--config", cfg}, 0,
			shape{keys: map[string]string{"file": "string", "ok": "bool", "notes": "array", "problems": "array"}}, "", nil},
		// config check's problems are its result: a missing file is one.
		{"config check/error", []string{"config", "check", "--json", "--config", missing}, 2,
			shape{keys: map[string]string{"file": "string", "ok": "bool", "notes": "array", "problems": "array"}}, "", nil},
		{"tools list", []string{"tools", "list", "--json", "--config", cfg}, 0, list{descriptor, 1}, "", nil},
		{"tools list/error", []string{"tools", "list", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
		{"tools list/unknown flag", []string{"tools", "list", "--bogus", "--json", "--config", cfg}, 2, nil, errCodeUsage, nil},
		{"tools search", []string{"tools", "search", "--json", "--config", cfg, "count"}, 0, list{descriptor, 1}, "", nil},
		{"tools search/error", []string{"tools", "search", "--json", "--config", cfg}, 2, nil, errCodeUsage, nil},
		{"skill list", []string{"skill", "list", "--json", "--config", cfg, "--workspace", quickstart}, 0,
			shape{keys: map[string]string{"skills": "array", "problems": "array"}, elem: map[string]shape{
				"skills": {keys: map[string]string{"name": "string", "source": "string", "state": "string", "description": "string", "path": "string"}}}}, "", nil},
		{"skill list/error", []string{"skill", "list", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
		{"approvals", []string{"approvals", "--json", "--config", cfg}, 0, list{approval, 1}, "", nil},
		{"approve", []string{"approve", toApprove.ID, "--json", "--by", "ops", "--config", cfg}, 0, approval, "", func(t *testing.T, v any) {
			if a := v.(map[string]any); a["state"] != "approved" || a["approved_by"] != "ops" || a["approved_at"] == nil {
				t.Errorf("approve printed %v, want it approved by ops", a)
			}
		}},
		{"approve/error", []string{"approve", "apr_00000000000000000000000000000000", "--json", "--by", "ops", "--config", cfg}, 1, nil, errCodeFailed, nil},
		{"token mint", []string{"token", "mint", "--json", "--sub", "alice", "--ttl", "1h"}, 0,
			shape{keys: map[string]string{"token": "string", "sub": "string", "expires_at": "string"}}, "", nil},
		{"token mint/error", []string{"token", "mint", "--json"}, 2, nil, errCodeUsage, nil},
		{"skill validate", []string{"skill", "validate", "--json", filepath.Join(quickstart, "skills")}, 0,
			shape{keys: map[string]string{"ok": "bool", "skills": "array", "problems": "array"}, elem: map[string]shape{
				"skills": {keys: map[string]string{"path": "string", "name": "string", "description": "string"}}}}, "", nil},
		{"skill validate/invalid", []string{"skill", "validate", "--json", badSkill}, 1,
			shape{keys: map[string]string{"ok": "bool", "skills": "array", "problems": "array"}}, "", func(t *testing.T, v any) {
				if r := v.(map[string]any); r["ok"] != false || !strings.Contains(fmt.Sprint(r["problems"]), "no frontmatter") {
					t.Errorf("an invalid skill: %v", r)
				}
			}},
		{"skill validate/error", []string{"skill", "validate", "--json"}, 2, nil, errCodeUsage, nil},
		{"tools show", []string{"tools", "show", "--json", "--config", cfg, "ext:notes:count_words"}, 0, descriptor, "", nil},
		{"tools show/error", []string{"tools", "show", "--json", "--config", cfg, "no_such_tool"}, 1, nil, errCodeFailed, nil},
		{"tools lock", []string{"tools", "lock", "--json", "--config", lockCfg}, 0,
			shape{keys: map[string]string{"file": "string", "pinned": "number", "skipped": "array"}}, "", func(t *testing.T, v any) {
				if r := v.(map[string]any); r["pinned"] != 1.0 || r["file"] != filepath.Join(lockDir, "capgate.lock") {
					t.Errorf("tools lock: %v, want the one extension tool pinned beside the config", r)
				}
			}},
		{"tools lock/error", []string{"tools", "lock", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
		{"reload", []string{"reload", "--json", "--config", srv.ConfigPath}, 0,
			shape{keys: map[string]string{"pid": "number", "signal": "string"}}, "", nil},
		{"reload/error", []string{"reload", "--json", "--config", cfg}, 1, nil, errCodeFailed, nil},
		{"accounts link", []string{"accounts", "link", "wiki", "--json", "--config", cfg, "--sub", "alice"}, 0,
			shape{keys: map[string]string{"sub": "string", "server": "string", "url": "string", "valid_until": "string"}}, "", nil},
		{"accounts revoke/error", []string{"accounts", "revoke", "wiki", "--json", "--config", cfg, "--sub", "alice"}, 1, nil, errCodeFailed, nil},
		{"console login", []string{"console", "login", "--json", "--config", consoleCfg, "--sub", "ops"}, 0,
			shape{keys: map[string]string{"url": "string", "sub": "string", "valid_until": "string"}}, "", nil},
		{"console login/error", []string{"console", "login", "--json", "--config", consoleCfg, "--sub", "eve"}, 2, nil, errCodeUsage, nil},
		{"audit tail/error", []string{"audit", "tail", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
		{"capability list", []string{"capability", "list", "--json", "--url", rpcURL}, 0,
			shape{keys: map[string]string{"capabilities": "array"}, elem: map[string]shape{"capabilities": {keys: map[string]string{
				"id": "string", "description": "string", "available": "bool", "requires_auth": "bool", "operations": "array"}}}}, "", nil},
		{"capability invoke", []string{"capability", "invoke", "--json", "--url", rpcURL, "--capability", "ext:notes:count_words", "--input-json", `{"text":"a b"}`}, 0,
			shape{keys: map[string]string{"ok": "bool", "output": "object", "request_id": "string", "invocation_id": "string",
				"duration_ms": "number", "side_effects": "array"}}, "", nil},
		{"capability invoke/denied", []string{"capability", "invoke", "--json", "--url", rpcURL, "--capability", "ext:notes:count_words"}, 1, nil, "permission_denied", nil},
		{"capability invoke/error", []string{"capability", "invoke", "--json", "--url", rpcURL}, 2, nil, errCodeUsage, nil},
		{"approvals/error", []string{"approvals", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
		{"accounts list", []string{"accounts", "list", "--json", "--config", cfg, "--sub", "alice"}, 0,
			list{shape{keys: map[string]string{"server": "string", "auth": "string", "linked": "bool"}}, 1}, "", nil},
		{"accounts list/error", []string{"accounts", "list", "--json", "--config", cfg}, 2, nil, errCodeUsage, nil},
		// Not fit: the development key, the wiki server down.
		{"verify", []string{"verify", "--prod", "--json", "--config", cfg}, 1,
			shape{keys: map[string]string{"file": "string", "ok": "bool", "problems": "array"}}, "", func(t *testing.T, v any) {
				if p := fmt.Sprint(v.(map[string]any)["problems"]); !strings.Contains(p, "auth.secret_env") {
					t.Errorf("verify's problems do not name the development key: %s", p)
				}
			}},
		{"verify/error", []string{"verify", "--json", "--config", cfg}, 2, nil, errCodeUsage, nil},
		{"audit verify", []string{"audit", "verify", "--json", intact}, 0,
			shape{keys: map[string]string{"ok": "bool", "logs": "array"}, elem: map[string]shape{"logs": auditLogShape}}, "", func(t *testing.T, v any) {
				if l := v.(map[string]any)["logs"].([]any)[0].(map[string]any); l["state"] != "intact" || l["lines"] != 3.0 {
					t.Errorf("intact log: %v", l)
				}
			}},
		{"audit verify/broken", []string{"audit", "verify", "--json", broken}, 1,
			shape{keys: map[string]string{"ok": "bool", "logs": "array"}, elem: map[string]shape{"logs": auditLogShape}}, "", func(t *testing.T, v any) {
				if l := v.(map[string]any)["logs"].([]any)[0].(map[string]any); l["state"] != "broken" || l["line"] != 3.0 {
					t.Errorf("broken log (line 2 edited, so line 3's prev is wrong): %v", l)
				}
			}},
		{"audit verify/error", []string{"audit", "verify", "--json", "--config", missing}, 2, nil, errCodeUsage, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, tc.args...)
			cmd.Dir, _ = os.Getwd()
			cmd.Env = append(os.Environ(), "CAPGATE_TOKEN_SECRET=", "ASH_CONTEXT_TOKEN=", "CAPGATE_TOKEN=", "CAPGATE_URL=")
			switch tc.name {
			case "token mint", "console login":
				cmd.Env = append(cmd.Env, "CAPGATE_TOKEN_SECRET=json-shape-test-secret-0123456789abcdef")
			case "capability list", "capability invoke":
				cmd.Env = append(cmd.Env, allowed)
			case "capability invoke/denied":
				cmd.Env = append(cmd.Env, narrowed)
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.exit {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.exit, stdout.String(), stderr.String())
			}
			switch want := tc.out.(type) {
			case nil:
				if stdout.Len() != 0 {
					t.Errorf("stdout holds %q, want nothing", stdout.String())
				}
			default:
				var v any
				dec := json.NewDecoder(&stdout)
				if err := dec.Decode(&v); err != nil {
					t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
				}
				if dec.More() {
					t.Errorf("stdout holds more than one JSON document")
				}
				switch want := want.(type) {
				case shape:
					want.check(t, "stdout", v)
				case list:
					a, ok := v.([]any)
					if !ok || len(a) < want.min {
						t.Fatalf("stdout is %s of %d, want an array of %d or more: %v", jsonKind(v), len(a), want.min, v)
					}
					for i, e := range a {
						want.elem.check(t, fmt.Sprintf("stdout[%d]", i), e)
					}
				}
				if tc.also != nil {
					tc.also(t, v)
				}
			}
			if tc.code == "" {
				// Warnings, if any, are JSON lines too.
				for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
					if l != "" && !json.Valid([]byte(l)) {
						t.Errorf("a stderr line is not JSON: %s", l)
					}
				}
				return
			}
			var e struct {
				Error *struct {
					Code    *string `json:"code"`
					Message *string `json:"message"`
				} `json:"error"`
			}
			// Warnings logged before it are JSON lines too; the error is the last.
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			for _, l := range lines[:len(lines)-1] {
				if !json.Valid([]byte(l)) || strings.Contains(l, `"error":{`) {
					t.Errorf("a stderr line before the error is not a JSON log line: %s", l)
				}
			}
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &e); err != nil || e.Error == nil || e.Error.Code == nil || e.Error.Message == nil {
				t.Fatalf("stderr does not end with one {\"error\":{\"code\",\"message\"}} line (%v): %q", err, stderr.String())
			}
			if *e.Error.Code != tc.code || *e.Error.Message == "" {
				t.Errorf("error %q %q, want code %q and a message", *e.Error.Code, *e.Error.Message, tc.code)
			}
			if tc.code == "permission_denied" && !strings.Contains(stderr.String(), `"hint":"`) {
				t.Errorf("a refusal without the server's hint: %s", stderr.String())
			}
		})
	}
}

// TestJSONErrorCodes: an error's stable code is its JSON code; else the
// exit status says usage (2) or failed (1).
func TestJSONErrorCodes(t *testing.T) {
	denied := &tool.Error{Code: tool.CodePermissionDenied, Message: "not granted", Hint: "grant it"}
	for _, tc := range []struct {
		exit            int
		err             error
		code, msg, hint string
	}{
		{exitDenied, fmt.Errorf("calling: %w", denied), "permission_denied", "calling: permission_denied: not granted", "grant it"},
		{exitDenied, denied, "permission_denied", "not granted", "grant it"},
		{exitUsage, tool.Errorf(tool.CodeNotFound, "no tool x"), "capability_not_found", "no tool x", ""},
		{exitUsage, errors.New("--config is required"), errCodeUsage, "--config is required", ""},
		{exitDenied, errors.New("store: locked"), errCodeFailed, "store: locked", ""},
	} {
		var b bytes.Buffer
		writeJSONError(&b, tc.exit, tc.err)
		var e jsonError
		if err := json.Unmarshal(b.Bytes(), &e); err != nil || e.Error != (jsonErrorBody{tc.code, tc.msg, tc.hint}) {
			t.Errorf("%v (exit %d): %s, want %q %q %q", tc.err, tc.exit, b.String(), tc.code, tc.msg, tc.hint)
		}
	}
}
