package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/internal/testkit"
)

// TestServeSkillsDir: `capgate serve --skills-dir` serves the installed
// skills there, below the workspace's (skills/ beside the config), and
// refuses a directory that is not there.
func TestServeSkillsDir(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs capgate serve")
	}
	bin, dir, addr := testkit.Build(t, capgatePkg), t.TempDir(), testkit.FreeAddr(t)
	write := func(path, desc string) {
		p := filepath.Join(dir, path, "SKILL.md")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("---\ndescription: "+desc+"\n---\nDo it.\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("installed/tidy", "Tidy up (installed)")
	write("installed/shared", "Shared (installed)")
	write("skills/shared", "Shared (workspace)")
	config := filepath.Join(dir, "capgate.toml")
	src := fmt.Sprintf("[server]\nlisten = %q\ndata_dir = \"data\"\nsocket = \"-\"\n[policy]\ngrants = [\"rye.fetch.*\"]\n", addr)
	if err := os.WriteFile(config, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"CAPGATE_TOKEN_SECRET=skills-dir-test-secret-4c3b2a", "HOME=" + dir}

	// Without the check it would serve; the timeout ends it.
	badCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := exec.CommandContext(badCtx, bin, "serve", "--config", config, "--skills-dir", filepath.Join(dir, "nowhere"))
	bad.Env = append(os.Environ(), env...)
	out, err := bad.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--skills-dir "+filepath.Join(dir, "nowhere")+": not a directory") {
		t.Errorf("serve with a missing --skills-dir: %v %s", err, out)
	}

	// The installed skills come from --skills-dir, or from Ash's
	// [skills] dirs in the config (relative to it, beside a skill table).
	configured := filepath.Join(dir, "configured.toml")
	addr2 := testkit.FreeAddr(t)
	src2 := fmt.Sprintf("[server]\nlisten = %q\ndata_dir = \"data2\"\nsocket = \"-\"\n[policy]\ngrants = [\"rye.fetch.*\"]\n"+
		"[skills]\ndirs = [\n  \"installed\",\n]\n[skills.tidy]\nTIDY_MODE = \"gentle\"\n", addr2)
	if err := os.WriteFile(configured, []byte(src2), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct {
		name, addr, config string
		args               []string
	}{
		{"flag", addr, config, []string{"--skills-dir", filepath.Join(dir, "installed")}},
		{"config", addr2, configured, nil},
	} {
		t.Run(run.name, func(t *testing.T) {
			addr, config := run.addr, run.config
			testkit.ServeArgs(t, bin, append([]string{"serve", "--config", config}, run.args...), env...)
			mint := exec.Command(bin, "token", "mint", "--config", config, "--sub", "alice")
			mint.Env = append(os.Environ(), env...)
			tok, err := mint.Output()
			if err != nil {
				t.Fatal(err)
			}
			tr, err := transport.NewStreamableHTTP("http://"+addr+"/mcp",
				transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + strings.TrimSpace(string(tok))}))
			if err != nil {
				t.Fatal(err)
			}
			c := newMCPClient(tr)
			ctx := context.Background()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			init := mcp.InitializeRequest{}
			init.Params.ProtocolVersion = "2025-11-25"
			init.Params.Capabilities.Sampling = &mcp.SamplingCapability{}
			if _, err := c.Initialize(ctx, init); err != nil {
				t.Fatal(err)
			}
			res, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, p := range res.Prompts {
				got[p.Name] = p.Description
			}
			if got["tidy"] != "Tidy up (installed)" || got["shared"] != "Shared (workspace)" || len(got) != 2 {
				t.Errorf("prompts = %v, want the installed tidy and the workspace's shared", got)
			}
		})
	}

	// A [skills] dirs entry that is not there is refused too, naming it.
	missing := filepath.Join(dir, "missing.toml")
	os.WriteFile(missing, []byte(fmt.Sprintf("[server]\nlisten = %q\ndata_dir = \"data3\"\nsocket = \"-\"\n[skills]\ndirs = [\"gone\"]\n", testkit.FreeAddr(t))), 0o600)
	badCtx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	bad2 := exec.CommandContext(badCtx2, bin, "serve", "--config", missing)
	bad2.Env = append(os.Environ(), env...)
	if out, err := bad2.CombinedOutput(); err == nil || !strings.Contains(string(out), "skills.dirs: "+filepath.Join(dir, "gone")+" is not a directory") {
		t.Errorf("serve with a missing [skills] dirs entry: %v %s", err, out)
	}
}
